/*
 * cmd_cache.c: `khub cache ls|verify|prune` on the shared Hugging Face
 * cache, and `khub cache quarantine|unquarantine` for the markers of kernel
 * builds that crashed: argument parsing and printing over khub/khub_cache.h.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "khub/khub_cache.h"
#include "khub/khub_hub.h"

static void human(uint64_t n, char *buf, size_t size)
{
    const char *u[] = {"B", "K", "M", "G", "T"};
    double v = (double)n;
    int i = 0;
    while (v >= 1000 && i < 4) v /= 1000, i++;
    snprintf(buf, size, i ? "%.1f%s" : "%.0f%s", v, u[i]);
}

static int cache_ls(khub_hub *hub, int json)
{
    khub_cache_report *r = NULL;
    if (khub_cache_scan(hub, &r) != KHUB_STATUS_OK)
        return khub_cli_fail("cache ls", "%s", khub_hub_errmsg(hub));
    char sz[32];
    if (json) {
        printf("{\"cache\":");
        khub_cli_json_str(khub_hub_cache_dir(hub));
        printf(",\"size\":%llu,\"repos\":[", (unsigned long long)r->size);
    } else {
        printf("%-42s %-8s %10s %6s %-24s\n", "REPO ID", "TYPE", "SIZE", "FILES", "REFS");
    }
    for (size_t i = 0; i < r->n_repos; i++) {
        const khub_cache_repo *p = &r->repos[i];
        if (json) {
            printf("%s{\"id\":", i ? "," : "");
            khub_cli_json_str(p->id);
            printf(",\"type\":\"%s\",\"folder\":", p->type);
            khub_cli_json_str(p->folder);
            printf(",\"size\":%llu,\"blobs\":%llu,\"warnings\":", (unsigned long long)p->size,
                   (unsigned long long)p->n_blobs);
            khub_cli_json_str(p->warnings);
            printf(",\"revisions\":[");
            for (size_t k = 0; k < p->n_revs; k++) {
                printf("%s{\"commit\":\"%s\",\"refs\":", k ? "," : "", p->revs[k].commit);
                khub_cli_json_str(p->revs[k].refs);
                printf(",\"files\":%llu,\"size\":%llu}", (unsigned long long)p->revs[k].n_files,
                       (unsigned long long)p->revs[k].size);
            }
            printf("]}");
            continue;
        }
        uint64_t files = 0;
        char refs[512] = "";
        for (size_t k = 0; k < p->n_revs; k++) {
            files += p->revs[k].n_files;
            size_t n = strlen(refs);
            if (p->revs[k].refs[0])
                snprintf(refs + n, sizeof refs - n, "%s%s", n ? ", " : "", p->revs[k].refs);
        }
        human(p->size, sz, sizeof sz);
        printf("%-42s %-8s %10s %6llu %-24s\n", p->id, p->type, sz, (unsigned long long)files,
               refs);
        for (size_t k = 0; k < p->n_revs; k++) {
            human(p->revs[k].size, sz, sizeof sz);
            printf("  %s %8s %5llu files  %s\n", p->revs[k].commit, sz,
                   (unsigned long long)p->revs[k].n_files,
                   p->revs[k].refs[0] ? p->revs[k].refs : "(detached)");
        }
        if (p->warnings[0]) printf("  warning: %s\n", p->warnings);
    }
    human(r->size, sz, sizeof sz);
    if (json)
        printf("]}\n");
    else
        printf("\n%zu repo(s), %s on disk in %s\n", r->n_repos, sz, khub_hub_cache_dir(hub));
    khub_cache_report_free(r);
    return 0;
}

/* How verify and prune report each blob or snapshot: a text line, or an
 * element of the JSON "items" array. */
typedef struct item_out {
    int json, dry;
    size_t n;
} item_out;

static void print_item(void *ud, const char *kind, const char *path, const char *detail)
{
    item_out *o = ud;
    if (!o->json) {
        printf("%s%s %s (%s)\n", o->dry ? "would remove " : "", kind, path, detail);
        return;
    }
    printf("%s{\"kind\":", o->n++ ? "," : "");
    khub_cli_json_str(kind);
    printf(",\"path\":");
    khub_cli_json_str(path);
    printf(",\"detail\":");
    khub_cli_json_str(detail);
    printf("}");
}

/* verify: exit 1 when a blob is corrupt; --json prints
 * {"items":[...],"checked":N,"corrupt":M} even then. */
static int cache_verify(khub_hub *hub, const char *id, int json)
{
    uint64_t checked = 0, bad = 0;
    item_out o = {json, 0, 0};
    if (json) printf("{\"items\":[");
    khub_status st = khub_cache_verify(hub, id, print_item, &o, &checked, &bad);
    if (json)
        printf("],\"checked\":%llu,\"corrupt\":%llu}\n", (unsigned long long)checked,
               (unsigned long long)bad);
    if (st != KHUB_STATUS_OK) return khub_cli_fail("cache verify", "%s", khub_hub_errmsg(hub));
    if (!json) printf("%llu files verified, none corrupt\n", (unsigned long long)checked);
    return 0;
}

/* prune: --json prints {"dry_run":B,"items":[...],"freed":BYTES}. */
static int cache_prune(khub_hub *hub, int dry, int json)
{
    uint64_t freed = 0;
    item_out o = {json, dry, 0};
    if (json) printf("{\"dry_run\":%s,\"items\":[", dry ? "true" : "false");
    khub_status st = khub_cache_prune(hub, dry, print_item, &o, &freed);
    if (json) printf("],\"freed\":%llu}\n", (unsigned long long)freed);
    if (st != KHUB_STATUS_OK) return khub_cli_fail("cache prune", "%s", khub_hub_errmsg(hub));
    char sz[32];
    human(freed, sz, sizeof sz);
    if (!json) printf("%s %s\n", dry ? "would free" : "freed", sz);
    return 0;
}

static void print_marker(void *ud, const char *repo, const char *commit, const char *variant,
                         const char *why)
{
    item_out *o = ud;
    if (!o->json) {
        printf("%s%s@%s %s: %s\n", o->dry ? "cleared " : "", repo, commit, variant, why);
        return;
    }
    printf("%s{\"repo\":", o->n++ ? "," : "");
    khub_cli_json_str(repo);
    printf(",\"commit\":\"%s\",\"variant\":", commit);
    khub_cli_json_str(variant);
    printf(",\"why\":");
    khub_cli_json_str(why);
    printf("}");
}

/* quarantine: lists the markers (of repo ID); unquarantine: removes them.
 * --json prints {"quarantined":[...]} or {"cleared":[...]}. */
static int cache_quarantine(khub_hub *hub, const char *id, int clear, int json)
{
    const char *cmd = clear ? "cache unquarantine" : "cache quarantine";
    item_out o = {json, clear, 0};
    size_t n = 0;
    if (json) printf("{\"%s\":[", clear ? "cleared" : "quarantined");
    khub_status st = clear ? khub_cache_quarantine_clear(hub, id, print_marker, &o, &n)
                           : khub_cache_quarantine_list(hub, id, print_marker, &o, &n);
    if (json) printf("]}\n");
    if (st != KHUB_STATUS_OK) return khub_cli_fail(cmd, "%s", khub_hub_errmsg(hub));
    if (!json && clear) printf("%zu quarantine marker(s) cleared\n", n);
    if (!json && !clear && !n) printf("no kernel build is quarantined\n");
    return 0;
}

static const khub_cli_cmd cache_cmd;
static int run_cache(int argc, char **argv)
{
    if (khub_cli_wants_help(&cache_cmd, argc, argv)) return 0;
    if (argc < 2)
        return khub_cli_usage(&cache_cmd,
                              "missing subcommand (ls, verify, prune, quarantine, unquarantine)");
    const char *sub = argv[1], *id = NULL, *dir = NULL;
    int json = 0, dry = 0, all = 0;
    int takes_id =
        !strcmp(sub, "verify") || !strcmp(sub, "quarantine") || !strcmp(sub, "unquarantine");
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--dry-run") && !strcmp(sub, "prune"))
            dry = 1;
        else if (!strcmp(argv[i], "--cache") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--all") && !strcmp(sub, "unquarantine"))
            all = 1;
        else if (argv[i][0] == '-')
            return khub_cli_usage(&cache_cmd, "unknown option %s", argv[i]);
        else if (!id && takes_id)
            id = argv[i];
        else
            return khub_cli_usage(&cache_cmd, "unexpected argument %s", argv[i]);
    }
    if (!strcmp(sub, "unquarantine") && !id == !all)
        return khub_cli_usage(&cache_cmd, "unquarantine needs a repo ID (org/name) or --all");
    khub_hub_opts o = {KHUB_APP_INIT(khub_hub_opts), .cache_dir = dir, .token = "", .offline = 1};
    khub_hub *hub = NULL;
    if (khub_hub_new(&o, &hub) != KHUB_STATUS_OK)
        return khub_cli_fail("cache", "%s", khub_last_error());
    int rc = 0;
    if (!strcmp(sub, "ls")) {
        rc = cache_ls(hub, json);
    } else if (!strcmp(sub, "verify")) {
        rc = cache_verify(hub, id, json);
    } else if (!strcmp(sub, "prune")) {
        rc = cache_prune(hub, dry, json);
    } else if (!strcmp(sub, "quarantine") || !strcmp(sub, "unquarantine")) {
        rc = cache_quarantine(hub, id, sub[0] == 'u', json);
    } else {
        rc = khub_cli_usage(
            &cache_cmd, "unknown subcommand %s (ls, verify, prune, quarantine, unquarantine)", sub);
    }
    khub_hub_free(hub);
    return rc;
}

static const khub_cli_cmd cache_cmd = {
    "cache", "list, verify or prune the shared Hugging Face cache, and its quarantine markers",
    "usage: khub cache ls [--json] [--cache DIR]\n"
    "       khub cache verify [ID] [--json] [--cache DIR]\n"
    "       khub cache prune [--dry-run] [--json] [--cache DIR]\n"
    "       khub cache quarantine [ID] [--json] [--cache DIR]\n"
    "       khub cache unquarantine ID|--all [--json] [--cache DIR]\n\n"
    "ls      repos, revisions (with the refs naming them), sizes and warnings, like\n"
    "        'hf cache scan' (kernel repos included).\n"
    "verify  re-hashes every blob (of repo ID, org/name or a folder name) against its\n"
    "        name: SHA-256 (64 hex) or git blob SHA-1 (40 hex), and snapshot files that\n"
    "        are copies (HF_HUB_DISABLE_SYMLINKS) against trees/<commit>.json (else\n"
    "        listed as unchecked), and reports temporary names interrupted downloads\n"
    "        left (stale); exits 1 if any is corrupt or stale.\n"
    "prune   removes snapshots no ref names, then blobs no kept snapshot links to\n"
    "        (symlink or hard link), then stale temporaries; touches nothing outside\n"
    "        the cache. --dry-run lists\n"
    "        what it would remove.\n"
    "quarantine    kernel builds (repo@commit variant) that crashed or called exit()\n"
    "        during a call, with what happened; a load of one is refused unless\n"
    "        allowed (khub run --allow-quarantined).\n"
    "unquarantine  removes the markers of repo ID (or --all), so the build loads again.\n"
    "--json  one JSON object: ls {cache,size,repos}; verify {items,checked,corrupt}\n"
    "        (printed even when a blob is corrupt); prune {dry_run,items,freed};\n"
    "        quarantine {quarantined}; unquarantine {cleared}: [{repo,commit,variant,why}].\n"
    "The cache is --cache, else KHUB_CACHE, HF_HUB_CACHE, HF_HOME/hub, ~/.cache/...\n",
    run_cache};
KHUB_CLI_COMMAND(cache_cmd)
