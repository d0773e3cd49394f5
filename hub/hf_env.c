/*
 * hf_env.c: huggingface_hub's environment variables read the way
 * huggingface_hub (constants.py) reads them, so that khub and the Python
 * tools pick the same cache, token file and offline mode from the same
 * environment:
 *
 *   - paths (HF_HOME, HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, XDG_CACHE_HOME,
 *     HF_TOKEN_PATH, and khub's KHUB_CACHE) go through os.path.expanduser
 *     and then os.path.expandvars: "~/x", "~user/x", "$VAR/x" and
 *     "${VAR}/x" are expanded, an unset $VAR is left as written;
 *   - offline is HF_HUB_OFFLINE when it is set and not empty, else
 *     TRANSFORMERS_OFFLINE (Python's `HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE`):
 *     HF_HUB_OFFLINE=0 wins over TRANSFORMERS_OFFLINE=1.
 *
 * Unlike huggingface_hub, an empty value counts as unset for the paths
 * (an empty HF_HOME would put the cache in the working directory).
 */
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hub_impl.h"

/* Appends n bytes of s to out (size bytes, NUL-terminated); 0 when full. */
static int put(char *out, size_t size, size_t *at, const char *s, size_t n)
{
    if (*at + n >= size) return 0;
    memcpy(out + *at, s, n);
    *at += n;
    out[*at] = '\0';
    return 1;
}

/* posixpath.expanduser: a leading "~" or "~name" up to the first '/'. */
static int expand_user(const char *in, char *out, size_t size)
{
    size_t at = 0;
    out[0] = '\0';
    if (in[0] != '~') return put(out, size, &at, in, strlen(in));
    const char *slash = strchr(in + 1, '/');
    size_t i = slash ? (size_t)(slash - in) : strlen(in);
    const char *home = NULL;
    if (i == 1) {
        home = getenv("HOME");
        if (!home) {
            struct passwd *pw = getpwuid(getuid());
            home = pw ? pw->pw_dir : NULL;
        }
    } else {
        char name[256];
        if (i - 1 >= sizeof name) return put(out, size, &at, in, strlen(in));
        memcpy(name, in + 1, i - 1);
        name[i - 1] = '\0';
        struct passwd *pw = getpwnam(name);
        home = pw ? pw->pw_dir : NULL;
    }
    if (!home) return put(out, size, &at, in, strlen(in)); /* no such user: as written */
    size_t hl = strlen(home);
    while (hl > 0 && home[hl - 1] == '/') hl--;
    if (!put(out, size, &at, home, hl) || !put(out, size, &at, in + i, strlen(in + i))) return 0;
    return at > 0 || put(out, size, &at, "/", 1);
}

static int is_word(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* posixpath.expandvars: $NAME ([A-Za-z0-9_]+) and ${NAME} ([^}]*) replaced
 * by the variable's value when it is set, left as written when not. */
static int expand_vars(const char *in, char *out, size_t size)
{
    size_t at = 0;
    out[0] = '\0';
    for (const char *p = in; *p;) {
        const char *name = NULL, *next = NULL;
        size_t nl = 0;
        if (p[0] == '$' && p[1] == '{' && strchr(p + 2, '}')) {
            name = p + 2;
            nl = (size_t)(strchr(p + 2, '}') - name);
            next = name + nl + 1;
        } else if (p[0] == '$' && is_word((unsigned char)p[1])) {
            name = p + 1;
            while (is_word((unsigned char)name[nl])) nl++;
            next = name + nl;
        }
        char key[256];
        const char *val = NULL;
        if (name && nl > 0 && nl < sizeof key) {
            memcpy(key, name, nl);
            key[nl] = '\0';
            val = getenv(key);
        }
        if (val) {
            if (!put(out, size, &at, val, strlen(val))) return 0;
            p = next;
        } else {
            size_t n = next ? (size_t)(next - p) : 1;
            if (!put(out, size, &at, p, n)) return 0;
            p += n;
        }
    }
    return 1;
}

int khub__expand_path(const char *in, char *out, size_t size)
{
    char user[KHUB__PATH_MAX];
    return expand_user(in, user, sizeof user) && expand_vars(user, out, size);
}

int khub__env_path(const char *name, char *out, size_t size)
{
    const char *v = getenv(name);
    if (!v || !v[0]) return 0;
    return khub__expand_path(v, out, size) ? 1 : -1;
}

bool khub__env_offline(void)
{
    const char *v = getenv("HF_HUB_OFFLINE");
    return v && v[0] ? khub__env_truthy("HF_HUB_OFFLINE")
                     : khub__env_truthy("TRANSFORMERS_OFFLINE");
}
