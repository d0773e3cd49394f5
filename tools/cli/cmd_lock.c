/*
 * cmd_lock.c: `khub lock`, `khub sync`, `khub outdated`, `khub update` (the
 * project's khub.json and khub.lock, docs/lockfile.md) and `khub fetch`
 * (one kernel by Hub ID through the full verified pipeline).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "hub_impl.h"
#include "kernel_fetch.h"
#include "kernel_mapping.h"
#include "khub/khub_kernels.h"
#include "lockfile.h"

typedef struct lock_args {
    const char *dir, *kernels, *lock, *import, *id, *policy;
    int all, strict, allow_unsigned, json, allow_name_mismatch, allow_downgrade;
} lock_args;

static const khub_cli_cmd outdated_cmd; /* the one listing command: takes --json */
static const khub_cli_cmd fetch_cmd;    /* the one loading command */
static const khub_cli_cmd update_cmd;   /* the one that may move pins back */

static int parse_args(const khub_cli_cmd *cmd, int argc, char **argv, lock_args *a, int want_id)
{
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        int more = i + 1 < argc;
        if (!strcmp(s, "--kernels") && more)
            a->kernels = argv[++i];
        else if (!strcmp(s, "--lock") && more)
            a->lock = argv[++i];
        else if (!strcmp(s, "--import") && more)
            a->import = argv[++i];
        else if (!strcmp(s, "--policy") && more)
            a->policy = argv[++i];
        else if (!strcmp(s, "--all-variants"))
            a->all = 1;
        else if (!strcmp(s, "--strict"))
            a->strict = 1;
        else if (!strcmp(s, "--allow-unsigned"))
            a->allow_unsigned = 1;
        else if (!strcmp(s, "--allow-downgrade") && cmd == &update_cmd)
            a->allow_downgrade = 1;
        else if (!strcmp(s, "--allow-name-mismatch") && cmd == &fetch_cmd)
            a->allow_name_mismatch = 1;
        else if (!strcmp(s, "--json") && cmd == &outdated_cmd)
            a->json = 1;
        else if (s[0] == '-')
            return khub_cli_usage(cmd, "unknown option %s", s);
        else if (want_id == 2 && !a->id)
            a->id = s;
        else if (want_id == 1 && a->dir && !a->id)
            a->id = s;
        else if (want_id != 2 && !a->dir)
            a->dir = s;
        else
            return khub_cli_usage(cmd, "unexpected argument %s", s);
    }
    if (!a->dir) a->dir = ".";
    if (want_id == 2 && !a->id) return khub_cli_usage(cmd, "missing Hub ID (org/name[@rev])");
    return 0;
}

static void path_in(char *buf, size_t n, const char *given, const char *dir, const char *file)
{
    if (given)
        snprintf(buf, n, "%s", given);
    else
        snprintf(buf, n, "%s/%s", dir, file);
}

static khub_hub *open_hub(const char *cmd)
{
    khub_hub *hub = NULL;
    if (khub_hub_new(NULL, &hub) != KHUB_STATUS_OK) {
        khub_cli_fail(cmd, "%s", khub_last_error());
        return NULL;
    }
    return hub;
}

/* Warns when e pins a version older than the repo's newest v<N>. */
static void warn_if_old(khub_hub *hub, const khub_lock_entry *e)
{
    khub_hub_id id;
    int32_t newest;
    char c[41];
    if (e->version < 0 || khub_hub_id_parse(e->repo, &id, NULL, 0) != KHUB_STATUS_OK) return;
    if (khub__kernel_newest_version(hub, &id, &newest, c) == KHUB_STATUS_OK && newest > e->version)
        fprintf(stderr, "khub: warning: %s is pinned to v%d, but v%d is the newest version\n",
                e->repo, (int)e->version, (int)newest);
}

static void print_pin(const char *verb, const khub_lock_entry *e)
{
    char pin[300];
    if (e->version >= 0)
        snprintf(pin, sizeof pin, "v%d", (int)e->version);
    else
        snprintf(pin, sizeof pin, "%s", e->revision);
    printf("%s %s %s -> %s (%zu variant%s)\n", verb, e->repo, pin, e->commit, e->n_variants,
           e->n_variants == 1 ? "" : "s");
}

/* A pin that now resolves to an older build than the one locked: the
 * branch was moved back (by its owner, or by whoever controls the hub).
 * Refused unless allowed (then a warning); returns nonzero to refuse. */
static int check_downgrade(const char *cmd, const khub_lock *lock, const khub_lock_entry *e,
                           int allow)
{
    const khub_lock_entry *old = khub__lock_find(lock, e->repo);
    bool comparable = false;
    /* A pin changed in khub.json (v2 -> v1) is the user's decision. */
    if (!old || old->version != e->version || strcmp(old->revision, e->revision) != 0 ||
        !old->kernel_version[0] || !e->kernel_version[0] ||
        khub__lock_version_cmp(e->kernel_version, old->kernel_version, &comparable) >= 0 ||
        !comparable)
        return 0;
    if (allow) {
        fprintf(stderr,
                "khub: warning: %s: downgrading from %s (commit %.12s) to %s (commit %.12s) "
                "(--allow-downgrade)\n",
                e->repo, old->kernel_version, old->commit, e->kernel_version, e->commit);
        return 0;
    }
    return khub_cli_fail(cmd,
                         "%s: the pin now resolves to commit %.12s, version %s, older than the "
                         "locked %s (commit %.12s): the branch was moved back to an older build; "
                         "refusing to downgrade (--allow-downgrade accepts it)",
                         e->repo, e->commit, e->kernel_version, old->kernel_version, old->commit);
}

/* ======================================================================== */
/* khub lock                                                                */
/* ======================================================================== */

static int lock_import(const char *cmd, khub_hub *hub, const char *path, khub_lock *lock)
{
    char why[KHUB_ERROR_SIZE];
    FILE *f = khub__fopen_regular(path, why, sizeof why);
    if (!f) return khub_cli_fail(cmd, "%s", why);
    static char buf[8 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    khub_lock *imp = NULL;
    char err[KHUB_ERROR_SIZE], notes[8192];
    if (khub__lock_new(&imp) != KHUB_STATUS_OK) return khub_cli_fail(cmd, "out of memory");
    if (khub__lock_import_python(buf, n, imp, notes, sizeof notes, err, sizeof err)) {
        khub__lock_free(imp);
        return khub_cli_fail(cmd, "%s: %s", path, err);
    }
    for (char *line = strtok(notes, "\n"); line; line = strtok(NULL, "\n"))
        fprintf(stderr, "khub lock: not mapped from %s: %s\n", path, line);
    int rc = 0;
    for (size_t i = 0; i < imp->count && !rc; i++) {
        khub_hub_id id;
        khub_lock_entry e;
        const khub_lock_entry *src = &imp->items[i];
        khub_hub_id_parse(src->repo, &id, NULL, 0);
        if (src->version >= 0)
            khub_hub_id_set_revision(&id, NULL, src->version);
        else
            khub_hub_id_set_revision(&id, src->revision, -1);
        if (khub__kernel_lock_entry(hub, &id, src->commit, &e) != KHUB_STATUS_OK) {
            rc = khub_cli_fail(cmd, "%s: %s", src->repo, khub_hub_errmsg(hub));
            break;
        }
        print_pin("imported", &e);
        if (e.n_variants == 0)
            fprintf(stderr, "khub lock: %s@%.12s has no khub variants; khub cannot load it\n",
                    e.repo, e.commit);
        khub__lock_put(lock, &e);
    }
    khub__lock_free(imp);
    return rc;
}

static int lock_mapping(const char *cmd, khub_hub *hub, const char *kpath, khub_lock *lock,
                        const char *only, int allow_downgrade)
{
    khub_mapping *m = NULL;
    char err[KHUB_ERROR_SIZE];
    if (khub__mapping_load(kpath, &m, err, sizeof err) != KHUB_STATUS_OK)
        return khub_cli_fail(cmd, "%s", err);
    const char *ids[KHUB_ROLE__COUNT * KHUB_MAP_MAX_RULES + KHUB_MAP_MAX_DEPS];
    size_t n = khub__mapping_kernels(m, ids, sizeof ids / sizeof ids[0]);
    int rc = 0, matched = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        khub_hub_id id;
        khub_lock_entry e;
        khub_hub_id_parse(ids[i], &id, NULL, 0);
        char repo[200];
        snprintf(repo, sizeof repo, "%s/%s", id.org, id.name);
        if (only && strcmp(only, repo) != 0) continue;
        matched++;
        if (khub__kernel_lock_entry(hub, &id, NULL, &e) != KHUB_STATUS_OK) {
            rc = khub_cli_fail(cmd, "%s: %s", ids[i], khub_hub_errmsg(hub));
            break;
        }
        if ((rc = check_downgrade(cmd, lock, &e, allow_downgrade))) {
            khub__lock_entry_clear(&e);
            break;
        }
        print_pin("locked", &e);
        warn_if_old(hub, &e);
        khub__lock_put(lock, &e);
    }
    free(m);
    if (!rc && only && !matched) rc = khub_cli_fail(cmd, "%s is not named in %s", only, kpath);
    return rc;
}

static const khub_cli_cmd lock_cmd;
static int run_lock(int argc, char **argv)
{
    if (khub_cli_wants_help(&lock_cmd, argc, argv)) return 0;
    lock_args a;
    int rc = parse_args(&lock_cmd, argc, argv, &a, 0);
    if (rc) return rc;
    char kpath[4096], lpath[4096], err[KHUB_ERROR_SIZE];
    path_in(kpath, sizeof kpath, a.kernels, a.dir, "khub.json");
    path_in(lpath, sizeof lpath, a.lock, a.dir, "khub.lock");
    khub_hub *hub = open_hub("lock");
    if (!hub) return 1;
    khub_lock *lock = NULL;
    khub__lock_new(&lock);
    if (a.import)
        rc = lock_import("lock", hub, a.import, lock);
    else
        rc = lock_mapping("lock", hub, kpath, lock, NULL, 0);
    if (!rc && khub__lock_save(lock, lpath, err, sizeof err) != KHUB_STATUS_OK)
        rc = khub_cli_fail("lock", "%s", err);
    if (!rc) printf("wrote %s (%zu kernel%s)\n", lpath, lock->count, lock->count == 1 ? "" : "s");
    khub__lock_free(lock);
    khub_hub_free(hub);
    return rc;
}

static const khub_cli_cmd lock_cmd = {
    "lock", "pin the kernels of khub.json into khub.lock (commits and content hashes)",
    "usage: khub lock [DIR] [--kernels FILE] [--lock FILE] [--import kernels.lock]\n\n"
    "Resolves every kernel named in DIR/khub.json (roles and dependencies) to a commit,\n"
    "downloads each of its khub variants (one archive request each) and writes DIR/khub.lock\n"
    "with the commit and, per variant, the SHA-256 of every file and the content hash\n"
    "(docs/lockfile.md). Warns when a pinned version is not the newest v<N> branch.\n\n"
    "  --kernels FILE  the mapping (default DIR/khub.json)\n"
    "  --lock FILE     the lock to write (default DIR/khub.lock)\n"
    "  --import FILE   take the commits of the Python kernels library's kernels.lock instead\n"
    "                  of khub.json; says what it could not map\n",
    run_lock};
KHUB_CLI_COMMAND(lock_cmd)

/* ======================================================================== */
/* khub sync                                                                */
/* ======================================================================== */

static int load_lock(const char *cmd, const lock_args *a, char *lpath, size_t n, khub_lock **out)
{
    char err[KHUB_ERROR_SIZE];
    path_in(lpath, n, a->lock, a->dir, "khub.lock");
    if (khub__lock_load(lpath, out, err, sizeof err) != KHUB_STATUS_OK)
        return khub_cli_fail(cmd, "%s", err);
    return 0;
}

/* A lock moved back to an older build than this machine already holds (a
 * revert, or a lock from an older checkout): sync installs exactly what the
 * lock says, so it warns instead of refusing; khub update refuses. */
static void warn_sync_downgrade(khub_hub *hub, const khub_lock_entry *e, const char *lpath)
{
    char newer[32], commit[41];
    if (khub__kernel_cached_newer(hub, e, newer, commit) != KHUB_STATUS_OK || !newer[0]) return;
    fprintf(stderr,
            "khub: warning: %s: %s pins version %s (commit %.12s), older than version %s "
            "(commit %.12s) already in this cache: was the lock moved back to an older build?\n",
            e->repo, lpath, e->kernel_version, e->commit, newer, commit);
}

static const khub_cli_cmd sync_cmd;
static int run_sync(int argc, char **argv)
{
    if (khub_cli_wants_help(&sync_cmd, argc, argv)) return 0;
    lock_args a;
    int rc = parse_args(&sync_cmd, argc, argv, &a, 0);
    if (rc) return rc;
    char lpath[4096];
    khub_lock *lock = NULL;
    if ((rc = load_lock("sync", &a, lpath, sizeof lpath, &lock))) return rc;
    khub_hub *hub = open_hub("sync");
    for (size_t i = 0; hub && i < lock->count && !rc; i++) {
        size_t n = 0;
        const khub_lock_entry *e = &lock->items[i];
        if (khub__kernel_sync_entry(hub, e, a.all, &n) != KHUB_STATUS_OK)
            rc = khub_cli_fail("sync", "%s", khub_hub_errmsg(hub));
        else {
            printf("synced %s@%s: %zu variant%s verified against %s\n", e->repo, e->commit, n,
                   n == 1 ? "" : "s", lpath);
            warn_sync_downgrade(hub, e, lpath);
        }
    }
    if (!hub) rc = 1;
    khub__lock_free(lock);
    khub_hub_free(hub);
    return rc;
}

static const khub_cli_cmd sync_cmd = {
    "sync", "download exactly the locked commits of khub.lock into the cache",
    "usage: khub sync [DIR] [--lock FILE] [--all-variants]\n\n"
    "Fetches the locked commit of every kernel in DIR/khub.lock (the variant this machine\n"
    "would load, or every locked variant with --all-variants, for air-gapped copies) and\n"
    "checks every file against the lock. A cached, matching variant makes no request.\n"
    "Warns when the cache already holds a newer version of a locked kernel (a lock moved\n"
    "back to an older build); it still installs what the lock pins.\n",
    run_sync};
KHUB_CLI_COMMAND(sync_cmd)

/* ======================================================================== */
/* khub outdated, khub update                                               */
/* ======================================================================== */

static int run_outdated(int argc, char **argv)
{
    if (khub_cli_wants_help(&outdated_cmd, argc, argv)) return 0;
    lock_args a;
    int rc = parse_args(&outdated_cmd, argc, argv, &a, 0);
    if (rc) return rc;
    char lpath[4096];
    khub_lock *lock = NULL;
    if ((rc = load_lock("outdated", &a, lpath, sizeof lpath, &lock))) return rc;
    khub_hub *hub = open_hub("outdated");
    int stale = 0;
    for (size_t i = 0; hub && i < lock->count && !rc; i++) {
        const khub_lock_entry *e = &lock->items[i];
        khub_hub_id id;
        char now[41];
        int32_t versions[64];
        size_t n_versions = 0;
        khub_hub_id_parse(e->repo, &id, NULL, 0);
        if (e->version >= 0)
            khub_hub_id_set_revision(&id, NULL, e->version);
        else
            khub_hub_id_set_revision(&id, e->revision, -1);
        if (khub_hub_resolve(hub, &id, now) != KHUB_STATUS_OK ||
            khub__kernel_versions(hub, &id, versions, 64, &n_versions) != KHUB_STATUS_OK) {
            rc = khub_cli_fail("outdated", "%s: %s", e->repo, khub_hub_errmsg(hub));
            break;
        }
        char pin[300];
        if (e->version >= 0)
            snprintf(pin, sizeof pin, "v%d", (int)e->version);
        else
            snprintf(pin, sizeof pin, "%s", e->revision);
        int32_t newest = n_versions ? versions[n_versions - 1] : -1;
        int moved = strcmp(now, e->commit) != 0, newer = e->version >= 0 && newest > e->version;
        stale |= moved || newer;
        if (a.json) {
            printf("%s{\"repo\":", i ? "," : "[");
            khub_cli_json_str(e->repo);
            printf(",\"pin\":");
            khub_cli_json_str(pin);
            printf(",\"locked\":\"%s\",\"now\":\"%s\",\"moved\":%s,\"newer\":[", e->commit, now,
                   moved ? "true" : "false");
            for (size_t k = 0, first = 1; e->version >= 0 && k < n_versions; k++)
                if (versions[k] > e->version)
                    printf("%s%d", first ? "" : ",", (int)versions[k]), first = 0;
            printf("],\"newest\":");
            if (newest >= 0)
                printf("%d}", (int)newest);
            else
                printf("null}");
            continue;
        }
        printf("%-40s %-8s locked %.12s  now %.12s%s", e->repo, pin, e->commit, now,
               moved ? "  (moved: khub update)" : "  (current)");
        if (newer) {
            printf("  newer");
            for (size_t k = 0; k < n_versions; k++)
                if (versions[k] > e->version) printf(" v%d", (int)versions[k]);
            printf(" (newest v%d)", (int)newest);
        }
        printf("\n");
    }
    if (a.json && !rc) printf("%s\n", lock->count ? "]" : "[]");
    if (!hub) rc = 1;
    khub__lock_free(lock);
    khub_hub_free(hub);
    return rc ? rc : stale ? 3 : 0;
}

static const khub_cli_cmd outdated_cmd = {
    "outdated", "show locked kernels whose pin moved or that have a newer version",
    "usage: khub outdated [DIR] [--lock FILE] [--json]\n\n"
    "For each kernel in DIR/khub.lock, resolves its pin again and lists the locked and the\n"
    "current commit, and every v<N> branch newer than a version pin. Exit status 3 when\n"
    "something is outdated. --json prints an array of {repo, pin, locked, now, moved, newer,\n"
    "newest} instead.\n",
    run_outdated};
KHUB_CLI_COMMAND(outdated_cmd)

static int run_update(int argc, char **argv)
{
    if (khub_cli_wants_help(&update_cmd, argc, argv)) return 0;
    lock_args a;
    int rc = parse_args(&update_cmd, argc, argv, &a, 1);
    if (rc) return rc;
    /* `khub update ORG/NAME` alone: the argument is the ID, not DIR. */
    if (!a.id && strchr(a.dir, '/') && access(a.dir, F_OK) != 0) a.id = a.dir, a.dir = ".";
    char lpath[4096], kpath[4096], err[KHUB_ERROR_SIZE];
    khub_lock *lock = NULL;
    if ((rc = load_lock("update", &a, lpath, sizeof lpath, &lock))) return rc;
    path_in(kpath, sizeof kpath, a.kernels, a.dir, "khub.json");
    khub_hub *hub = open_hub("update");
    char only[200] = "";
    if (a.id) {
        khub_hub_id id;
        if (khub_hub_id_parse(a.id, &id, err, sizeof err) != KHUB_STATUS_OK)
            rc = khub_cli_fail("update", "%s", err);
        snprintf(only, sizeof only, "%s/%s", id.org, id.name);
    }
    if (!hub) rc = 1;
    if (!rc && access(kpath, R_OK) == 0) {
        rc = lock_mapping("update", hub, kpath, lock, only[0] ? only : NULL, a.allow_downgrade);
    } else {
        for (size_t i = 0; !rc && i < lock->count; i++) {
            khub_lock_entry *old = &lock->items[i], e;
            if (only[0] && strcmp(only, old->repo)) continue;
            khub_hub_id id;
            khub_hub_id_parse(old->repo, &id, NULL, 0);
            if (old->version >= 0)
                khub_hub_id_set_revision(&id, NULL, old->version);
            else
                khub_hub_id_set_revision(&id, old->revision, -1);
            if (khub__kernel_lock_entry(hub, &id, NULL, &e) != KHUB_STATUS_OK)
                rc = khub_cli_fail("update", "%s: %s", old->repo, khub_hub_errmsg(hub));
            else if ((rc = check_downgrade("update", lock, &e, a.allow_downgrade)))
                khub__lock_entry_clear(&e);
            else
                print_pin("updated", &e), warn_if_old(hub, &e), khub__lock_put(lock, &e);
        }
    }
    if (!rc && khub__lock_save(lock, lpath, err, sizeof err) != KHUB_STATUS_OK)
        rc = khub_cli_fail("update", "%s", err);
    if (!rc) printf("wrote %s\n", lpath);
    khub__lock_free(lock);
    khub_hub_free(hub);
    return rc;
}

static const khub_cli_cmd update_cmd = {
    "update", "re-resolve the pins of khub.lock (all, or one kernel) and rewrite it",
    "usage: khub update [DIR] [ORG/NAME] [--kernels FILE] [--lock FILE] [--allow-downgrade]\n\n"
    "Resolves the pins again (from DIR/khub.json when present, else from the lock's own\n"
    "version/revision), downloads and hashes the new commits, and rewrites DIR/khub.lock.\n"
    "A pin that now resolves to an older kernel version than the locked one (its branch\n"
    "was moved back) is refused and the lock left as it was, unless --allow-downgrade.\n",
    run_update};
KHUB_CLI_COMMAND(update_cmd)

/* ======================================================================== */
/* khub fetch                                                               */
/* ======================================================================== */

static int run_fetch(int argc, char **argv)
{
    if (khub_cli_wants_help(&fetch_cmd, argc, argv)) return 0;
    lock_args a;
    int rc = parse_args(&fetch_cmd, argc, argv, &a, 2);
    if (rc) return rc;
    khub_runtime *rt = khub_cli_runtime("fetch", 1);
    khub_hub *hub = rt ? open_hub("fetch") : NULL;
    if (!hub) {
        khub_runtime_free(rt);
        return 1;
    }
    khub_kernel_opts ko = {KHUB_STRUCT_INIT(khub_kernel_opts),
                           .policy_path = a.policy,
                           .lock_path = a.lock,
                           .allow_unsigned = a.allow_unsigned,
                           .strict = a.strict,
                           .allow_name_mismatch = a.allow_name_mismatch};
    khub_kernel_result kr = {KHUB_STRUCT_INIT(khub_kernel_result)};
    khub_status st = khub_kernel_fetch(hub, rt, a.id, &ko, &kr);
    if (st != KHUB_STATUS_OK) {
        rc = khub_cli_fail("fetch", "%s: %s", khub_status_name(st), khub_runtime_errmsg(rt));
    } else {
        printf("kernel   %s@%s%s\n", kr.repo, kr.commit, kr.locked ? " (locked, verified)" : "");
        printf("variant  %s\n", kr.fell_back ? "(none fits: fallback)" : kr.variant);
        printf("plugin   %s%s%s\n", kr.plugin_id, kr.file[0] ? " from " : "", kr.file);
        if (kr.plugin) printf("version  %s\n", khub_plugin_version(kr.plugin));
        printf("trust    %s\n", kr.trust);
        printf("requests %llu\n", (unsigned long long)khub_hub_request_count(hub));
        printf("trace\n");
        for (char *line = strtok(kr.trace, "\n"); line; line = strtok(NULL, "\n"))
            printf("  %s\n", line);
    }
    khub_hub_free(hub);
    khub_runtime_free(rt);
    return rc;
}

static const khub_cli_cmd fetch_cmd = {
    "fetch", "fetch, verify and load one kernel by Hub ID (the load-time pipeline)",
    "usage: khub fetch ORG/NAME[@REV|@version=N][:SYMBOL] [--lock FILE] [--policy FILE]\n"
    "                  [--allow-unsigned] [--allow-name-mismatch] [--strict]\n\n"
    "Resolves the ID (or takes the commit from --lock), ranks the variants for this\n"
    "machine, downloads the best one, checks the lock's hashes, decides trust on\n"
    "metadata.json and its signature, verifies every digest, and loads the plugin for this\n"
    "CPU into a runtime. Prints what was loaded, the trust decision, the number of HTTP\n"
    "requests and the variant trace. Without a fitting variant it falls back to\n"
    "khub/ref-cpu with a warning, or fails with --strict.\n\n"
    "  --lock FILE       load through khub.lock (its commit; hashes re-checked)\n"
    "  --policy FILE     trust policy (default $KHUB_POLICY, ~/.config/khub/policy.json)\n"
    "  --allow-unsigned  accept unsigned kernels of organisations the policy omits\n"
    "  --allow-name-mismatch  load a build whose signed metadata names another kernel\n"
    "                    or variant than the one asked for (refused by default)\n"
    "  --strict          no fallback\n",
    run_fetch};
KHUB_CLI_COMMAND(fetch_cmd)
