/*
 * cmd_lock.c: `khub lock`, `khub sync`, `khub outdated`, `khub update` (the
 * project's khub.json and khub.lock, docs/lockfile.md) and `khub fetch`
 * (one kernel by Hub ID through the full verified pipeline).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "khub/khub_kernels.h"
#include "khub/khub_project.h"

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

/* Warns when p pins a version older than the repo's newest v<N>. */
static void warn_if_old(khub_hub *hub, const khub_lock_pin *p)
{
    khub_hub_id id;
    int32_t versions[1024];
    size_t n = 0;
    if (p->version < 0 || khub_hub_id_parse(p->repo, &id, NULL, 0) != KHUB_STATUS_OK) return;
    if (khub_kernel_versions(hub, &id, versions, 1024, &n) == KHUB_STATUS_OK && n &&
        versions[n - 1] > p->version)
        fprintf(stderr, "khub: warning: %s is pinned to v%d, but v%d is the newest version\n",
                p->repo, (int)p->version, (int)versions[n - 1]);
}

static void pin_text(const khub_lock_pin *p, char *buf, size_t n)
{
    if (p->version >= 0)
        snprintf(buf, n, "v%d", (int)p->version);
    else
        snprintf(buf, n, "%s", p->revision);
}

static void print_pin(const char *verb, const khub_lock_pin *p)
{
    char pin[300];
    pin_text(p, pin, sizeof pin);
    printf("%s %s %s -> %s (%u variant%s)\n", verb, p->repo, pin, p->commit,
           (unsigned)p->n_variants, p->n_variants == 1 ? "" : "s");
}

/* Locks id into lock (khub_lock_kernel) and says what happened: a failure
 * named by label (a refused downgrade names itself), an allowed downgrade's
 * warning, the new pin, and a warning when it is not the newest version.
 * Returns the exit code. */
static int lock_one(const char *cmd, const char *verb, khub_hub *hub, khub_lock *lock,
                    const khub_hub_id *id, const char *label, int allow_downgrade)
{
    khub_lock_opts o = {KHUB_APP_INIT(khub_lock_opts), .allow_downgrade = allow_downgrade};
    khub_lock_result r = {KHUB_APP_INIT(khub_lock_result)};
    khub_status st = khub_lock_kernel(hub, lock, id, &o, &r);
    if (st == KHUB_STATUS_DOWNGRADE) return khub_cli_fail(cmd, "%s", khub_hub_errmsg(hub));
    if (st != KHUB_STATUS_OK) return khub_cli_fail(cmd, "%s: %s", label, khub_hub_errmsg(hub));
    if (r.downgrade)
        fprintf(stderr,
                "khub: warning: %s: downgrading from %s (commit %.12s) to %s (commit %.12s) "
                "(--allow-downgrade)\n",
                r.pin.repo, r.previous.kernel_version, r.previous.commit, r.pin.kernel_version,
                r.pin.commit);
    print_pin(verb, &r.pin);
    warn_if_old(hub, &r.pin);
    return 0;
}

/* ======================================================================== */
/* khub lock                                                                */
/* ======================================================================== */

static int lock_import(const char *cmd, khub_hub *hub, const char *path, khub_lock *lock)
{
    khub_lock *imp = NULL;
    char err[KHUB_ERROR_SIZE], notes[8192];
    if (khub_lock_import_python(path, &imp, notes, sizeof notes, err, sizeof err))
        return khub_cli_fail(cmd, "%s", err);
    for (char *line = strtok(notes, "\n"); line; line = strtok(NULL, "\n"))
        fprintf(stderr, "khub lock: not mapped from %s: %s\n", path, line);
    int rc = 0;
    for (size_t i = 0; i < khub_lock_count(imp) && !rc; i++) {
        khub_hub_id id;
        khub_lock_pin src = {KHUB_APP_INIT(khub_lock_pin)};
        khub_lock_pin_at(imp, i, &src);
        khub_lock_pin_id(&src, &id);
        /* A kernels.lock names each kernel once; allow_downgrade keeps a
         * repeated one from being judged against the first. */
        khub_lock_opts o = {KHUB_APP_INIT(khub_lock_opts), .commit = src.commit,
                            .allow_downgrade = 1};
        khub_lock_result r = {KHUB_APP_INIT(khub_lock_result)};
        if (khub_lock_kernel(hub, lock, &id, &o, &r) != KHUB_STATUS_OK) {
            rc = khub_cli_fail(cmd, "%s: %s", src.repo, khub_hub_errmsg(hub));
            break;
        }
        print_pin("imported", &r.pin);
        if (r.pin.n_variants == 0)
            fprintf(stderr, "khub lock: %s@%.12s has no khub variants; khub cannot load it\n",
                    r.pin.repo, r.pin.commit);
    }
    khub_lock_free(imp);
    return rc;
}

static int lock_mapping(const char *cmd, khub_hub *hub, const char *kpath, khub_lock *lock,
                        const char *only, int allow_downgrade)
{
    khub_mapping *m = NULL;
    char err[KHUB_ERROR_SIZE];
    if (khub_mapping_load(kpath, &m, err, sizeof err) != KHUB_STATUS_OK)
        return khub_cli_fail(cmd, "%s", err);
    int rc = 0, matched = 0;
    for (size_t i = 0; i < khub_mapping_kernel_count(m) && !rc; i++) {
        const char *text = khub_mapping_kernel(m, i);
        khub_hub_id id;
        khub_hub_id_parse(text, &id, NULL, 0);
        char repo[200];
        snprintf(repo, sizeof repo, "%s/%s", id.org, id.name);
        if (only && strcmp(only, repo) != 0) continue;
        matched++;
        if (khub_cli_is_builtin_plugin(repo)) {
            fprintf(stderr, "khub %s: %s is a built-in plugin: nothing to lock\n", cmd, text);
            continue;
        }
        rc = lock_one(cmd, "locked", hub, lock, &id, text, allow_downgrade);
    }
    khub_mapping_free(m);
    if (!rc && only && !matched) rc = khub_cli_fail(cmd, "%s is not named in %s", only, kpath);
    return rc;
}

/* The line khub lock and khub update end with: the file and how many
 * kernels it pins. */
static void print_wrote(const char *lpath, const khub_lock *lock)
{
    size_t n = khub_lock_count(lock);
    printf("wrote %s (%zu kernel%s)\n", lpath, n, n == 1 ? "" : "s");
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
    if (khub_lock_new(&lock) != KHUB_STATUS_OK)
        rc = khub_cli_fail("lock", "%s", khub_last_error());
    else if (a.import)
        rc = lock_import("lock", hub, a.import, lock);
    else
        rc = lock_mapping("lock", hub, kpath, lock, NULL, 0);
    if (!rc && khub_lock_save(lock, lpath, err, sizeof err) != KHUB_STATUS_OK)
        rc = khub_cli_fail("lock", "%s", err);
    if (!rc) print_wrote(lpath, lock);
    khub_lock_free(lock);
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
    if (khub_lock_load(lpath, out, err, sizeof err) != KHUB_STATUS_OK)
        return khub_cli_fail(cmd, "%s", err);
    return 0;
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
    khub_sync_opts so = {KHUB_APP_INIT(khub_sync_opts), .all_variants = a.all};
    for (size_t i = 0; hub && i < khub_lock_count(lock) && !rc; i++) {
        khub_lock_pin e = {KHUB_APP_INIT(khub_lock_pin)};
        khub_sync_result r = {KHUB_APP_INIT(khub_sync_result)};
        khub_lock_pin_at(lock, i, &e);
        if (khub_lock_sync(hub, lock, i, &so, &r) != KHUB_STATUS_OK) {
            rc = khub_cli_fail("sync", "%s", khub_hub_errmsg(hub));
            break;
        }
        printf("synced %s@%s: %u variant%s verified against %s\n", e.repo, e.commit,
               (unsigned)r.n_checked, r.n_checked == 1 ? "" : "s", lpath);
        /* A lock moved back to an older build than this machine already
         * holds (a revert, or a lock from an older checkout): sync installs
         * exactly what the lock says, so it warns; khub update refuses. */
        if (r.newer_version[0])
            fprintf(stderr,
                    "khub: warning: %s: %s pins version %s (commit %.12s), older than version %s "
                    "(commit %.12s) already in this cache: was the lock moved back to an older "
                    "build?\n",
                    e.repo, lpath, e.kernel_version, e.commit, r.newer_version, r.newer_commit);
    }
    if (!hub) rc = 1;
    khub_lock_free(lock);
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
    "back to an older build); it still installs what the lock pins.\n\n"
    "  --lock FILE     the lock to read (default DIR/khub.lock)\n"
    "  --all-variants  every locked variant, not only the one this machine would load\n",
    run_sync};
KHUB_CLI_COMMAND(sync_cmd)

/* ======================================================================== */
/* khub outdated, khub update                                               */
/* ======================================================================== */

static void print_outdated_json(size_t i, const khub_lock_pin *e, const char *pin,
                                const khub_outdated_result *r)
{
    printf("%s{\"repo\":", i ? "," : "[");
    khub_cli_json_str(e->repo);
    printf(",\"pin\":");
    khub_cli_json_str(pin);
    printf(",\"locked\":\"%s\",\"now\":\"%s\",\"moved\":%s,\"newer\":[", e->commit, r->now,
           r->moved ? "true" : "false");
    for (uint32_t k = 0; k < r->n_newer; k++) printf("%s%d", k ? "," : "", (int)r->newer[k]);
    printf("],\"newest\":");
    if (r->newest >= 0)
        printf("%d}", (int)r->newest);
    else
        printf("null}");
}

static void print_outdated(const khub_lock_pin *e, const char *pin, const khub_outdated_result *r)
{
    printf("%-40s %-8s locked %.12s  now %.12s%s", e->repo, pin, e->commit, r->now,
           r->moved ? "  (moved: khub update)" : "  (current)");
    if (r->n_newer) {
        printf("  newer");
        for (uint32_t k = 0; k < r->n_newer; k++) printf(" v%d", (int)r->newer[k]);
        printf(" (newest v%d)", (int)r->newest);
    }
    printf("\n");
}

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
    for (size_t i = 0; hub && i < khub_lock_count(lock) && !rc; i++) {
        khub_lock_pin e = {KHUB_APP_INIT(khub_lock_pin)};
        khub_outdated_result r = {KHUB_APP_INIT(khub_outdated_result)};
        khub_lock_pin_at(lock, i, &e);
        if (khub_lock_outdated(hub, lock, i, &r) != KHUB_STATUS_OK) {
            rc = khub_cli_fail("outdated", "%s: %s", e.repo, khub_hub_errmsg(hub));
            break;
        }
        char pin[300];
        pin_text(&e, pin, sizeof pin);
        stale |= r.moved || r.n_newer;
        if (a.json)
            print_outdated_json(i, &e, pin, &r);
        else
            print_outdated(&e, pin, &r);
    }
    if (a.json && !rc) printf("%s\n", khub_lock_count(lock) ? "]" : "[]");
    if (!hub) rc = 1;
    khub_lock_free(lock);
    khub_hub_free(hub);
    return rc ? rc : stale ? 3 : 0;
}

static const khub_cli_cmd outdated_cmd = {
    "outdated", "show locked kernels whose pin moved or that have a newer version",
    "usage: khub outdated [DIR] [--lock FILE] [--json]\n\n"
    "For each kernel in DIR/khub.lock, resolves its pin again and lists the locked and the\n"
    "current commit, and every v<N> branch newer than a version pin. Exit status 3 when\n"
    "something is outdated. --json prints an array of {repo, pin, locked, now, moved, newer,\n"
    "newest} instead. --lock FILE reads FILE instead of DIR/khub.lock.\n",
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
        for (size_t i = 0; !rc && i < khub_lock_count(lock); i++) {
            khub_lock_pin old = {KHUB_APP_INIT(khub_lock_pin)};
            khub_hub_id id;
            khub_lock_pin_at(lock, i, &old);
            if (only[0] && strcmp(only, old.repo)) continue;
            khub_lock_pin_id(&old, &id);
            rc = lock_one("update", "updated", hub, lock, &id, old.repo, a.allow_downgrade);
        }
    }
    if (!rc && khub_lock_save(lock, lpath, err, sizeof err) != KHUB_STATUS_OK)
        rc = khub_cli_fail("update", "%s", err);
    if (!rc) print_wrote(lpath, lock);
    khub_lock_free(lock);
    khub_hub_free(hub);
    return rc;
}

static const khub_cli_cmd update_cmd = {
    "update", "re-resolve the pins of khub.lock (all, or one kernel) and rewrite it",
    "usage: khub update [DIR] [ORG/NAME] [--kernels FILE] [--lock FILE] [--allow-downgrade]\n\n"
    "Resolves the pins again (from DIR/khub.json when present, else from the lock's own\n"
    "version/revision), downloads and hashes the new commits, and rewrites DIR/khub.lock.\n"
    "A pin that now resolves to an older kernel version than the locked one (its branch\n"
    "was moved back) is refused and the lock left as it was, unless --allow-downgrade.\n"
    "With ORG/NAME only that kernel's pin is moved.\n\n"
    "  --kernels FILE     the mapping (default DIR/khub.json)\n"
    "  --lock FILE        the lock to rewrite (default DIR/khub.lock)\n"
    "  --allow-downgrade  take a pin that moved back to an older kernel version (warns)\n",
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
    khub_kernel_opts ko = {KHUB_APP_INIT(khub_kernel_opts),
                           .policy_path = a.policy,
                           .lock_path = a.lock,
                           .allow_unsigned = a.allow_unsigned,
                           .strict = a.strict,
                           .allow_name_mismatch = a.allow_name_mismatch};
    khub_kernel_result kr = {KHUB_APP_INIT(khub_kernel_result)};
    khub_status st = khub_kernel_fetch(hub, rt, a.id, &ko, &kr);
    if (st != KHUB_STATUS_OK) {
        /* "khub fetch: MESSAGE", as every command (before session 18 the
         * status name came first, here only) */
        rc = khub_cli_fail("fetch", "%s", khub_runtime_errmsg(rt));
    } else {
        printf("kernel   %s@%s%s\n", kr.repo, kr.commit, kr.locked ? " (locked, verified)" : "");
        printf("variant  %s\n", kr.fell_back ? "(none fits: fallback)" : kr.variant);
        printf("plugin   %s%s%s\n", kr.plugin_id, kr.file[0] ? " from " : "", kr.file);
        if (kr.plugin) printf("version  %s\n", khub_plugin_version(kr.plugin));
        char hint[sizeof kr.trust + 64];
        printf("trust    %s\n", khub_cli_flag_hints(kr.trust, hint, sizeof hint));
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
