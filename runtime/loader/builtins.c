/*
 * builtins.c: the built-in plugins, loaded from the manifest the build
 * writes (plugins.json: each file's name and SHA-256), through the same
 * verifying loader as any other plugin.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "install_paths.h"
#include "loader_impl.h"

/* ======================================================================== */
/* Built-ins                                                                */
/* ======================================================================== */

static bool plain_file_name(const char *s)
{
    size_t len = strnlen(s, NAME_MAX + 1);
    return len > 0 && len <= NAME_MAX && !strchr(s, '/') && !strstr(s, "..") && strcmp(s, ".") != 0;
}

static bool file_exists(const char *path) { return access(path, R_OK) == 0; }

/* The manifest's directory: $KHUB_PLUGIN_DIR; else the plugins of the
 * install prefix this library runs from (an installed tree, wherever it was
 * installed or moved); else the build tree's; else the install directory
 * compiled in. buf holds the relocated path. */
static const char *builtin_dir(char *buf, size_t size)
{
    const char *env = getenv("KHUB_PLUGIN_DIR");
    if (env && env[0]) return env;
    char probe[PATH_MAX + 16];
    if (khub__install_path(KHUB_PLUGIN_INSTALL_REL, buf, size)) {
        snprintf(probe, sizeof probe, "%s/plugins.json", buf);
        if (file_exists(probe)) return buf;
    }
    if (file_exists(KHUB_PLUGIN_BUILD_DIR "/plugins.json")) return KHUB_PLUGIN_BUILD_DIR;
    return KHUB_PLUGIN_INSTALL_DIR;
}

static bool sha_loaded(khub_runtime *rt, const char *sha)
{
    bool found = false;
    pthread_rwlock_rdlock(&rt->reg_lock);
    for (size_t i = 0; i < rt->plugins.count && !found; i++)
        found = khub__digest_eq(rt->plugins.items[i]->sha256, sha);
    pthread_rwlock_unlock(&rt->reg_lock);
    return found;
}

static khub_status load_entry(khub_runtime *rt, const char *dir, const char *mpath, const cJSON *e,
                              int idx)
{
    const cJSON *file = cJSON_GetObjectItemCaseSensitive(e, "file");
    const cJSON *sha = cJSON_GetObjectItemCaseSensitive(e, "sha256");
    KHUB_RETURN_IF(rt, !cJSON_IsString(file) || !cJSON_IsString(sha), KHUB_STATUS_PARSE,
                   "%s: plugins[%d] needs string fields \"file\" and \"sha256\"", mpath, idx);
    KHUB_RETURN_IF(rt, !plain_file_name(file->valuestring), KHUB_STATUS_UNSAFE_PATH,
                   "%s: plugins[%d].file \"%.100s\" is not a plain file name", mpath, idx,
                   file->valuestring);
    KHUB_RETURN_IF(rt, !khub__is_sha256_hex(sha->valuestring), KHUB_STATUS_PARSE,
                   "%s: plugins[%d].sha256 is not 64 hex digits", mpath, idx);
    if (sha_loaded(rt, sha->valuestring)) return KHUB_STATUS_OK;
    char path[PATH_MAX];
    int len = snprintf(path, sizeof path, "%s/%s", dir, file->valuestring);
    KHUB_RETURN_IF(rt, len < 0 || (size_t)len >= sizeof path, KHUB_STATUS_INVALID_ARG,
                   "%s/%s: path exceeds PATH_MAX", dir, file->valuestring);
    return khub_plugin_load(rt, path, sha->valuestring, NULL);
}

khub_status khub_plugin_load_builtin(khub_runtime *rt)
{
    KHUB_API_CHECK(NULL, rt != NULL);
    khub__clear(rt);
    char dirbuf[PATH_MAX];
    const char *dir = builtin_dir(dirbuf, sizeof dirbuf);
    char mpath[PATH_MAX], msg[KHUB_ERROR_SIZE];
    int len = snprintf(mpath, sizeof mpath, "%s/plugins.json", dir);
    KHUB_RETURN_IF(rt, len < 0 || (size_t)len >= sizeof mpath, KHUB_STATUS_INVALID_ARG,
                   "KHUB_PLUGIN_DIR is longer than PATH_MAX");
    unsigned char *text = NULL;
    size_t size = 0;
    khub_status st =
        khub__plugin_read_file(rt, mpath, MAX_MANIFEST_BYTES, &text, &size, msg, sizeof msg);
    if (st != KHUB_STATUS_OK)
        return khub__fail(rt, st,
                          "built-in plugins: %s; set KHUB_PLUGIN_DIR to the directory "
                          "holding plugins.json",
                          msg);
    cJSON *root = cJSON_ParseWithLength((const char *)text, size);
    khub__free(rt, text, size + 1);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "plugins");
    if (!cJSON_IsArray(list)) {
        cJSON_Delete(root);
        return khub__fail(rt, KHUB_STATUS_PARSE,
                          "%s: not JSON of the form {\"plugins\": [{\"file\", \"sha256\"}]}",
                          mpath);
    }
    int idx = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, list)
    {
        st = load_entry(rt, dir, mpath, e, idx++);
        if (st != KHUB_STATUS_OK) break;
    }
    cJSON_Delete(root);
    return st;
}
