/*
 * cmd_hub.c: `khub resolve`, `khub download`, `khub variants`, `khub serve`.
 * (`khub cache ls|verify|prune` is in cmd_cache.c.)
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "khub/khub_hub.h"
#include "khub/khub_server.h"

typedef struct hub_args {
    const char *id_text, *variant, *file;
    int json, quiet, all;
} hub_args;

static int parse_common(const khub_cli_cmd *cmd, int argc, char **argv, hub_args *a)
{
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            a->json = 1;
        else if (!strcmp(argv[i], "--quiet") || !strcmp(argv[i], "-q"))
            a->quiet = 1;
        else if (!strcmp(argv[i], "--all-variants"))
            a->all = 1;
        else if (!strcmp(argv[i], "--variant") && i + 1 < argc)
            a->variant = argv[++i];
        else if (!strcmp(argv[i], "--file") && i + 1 < argc)
            a->file = argv[++i];
        else if (argv[i][0] == '-')
            return khub_cli_usage(cmd, "unknown option %s", argv[i]);
        else if (!a->id_text)
            a->id_text = argv[i];
        else
            return khub_cli_usage(cmd, "unexpected argument %s", argv[i]);
    }
    if (!a->id_text) return khub_cli_usage(cmd, "missing Hub ID (org/name[@rev])");
    return 0;
}

static int open_hub(const char *cmd, const hub_args *a, khub_hub_id *id, khub_hub **hub,
                    char commit[41])
{
    char err[KHUB_ERROR_SIZE];
    if (khub_hub_id_parse(a->id_text, id, err, sizeof err) != KHUB_STATUS_OK)
        return khub_cli_fail(cmd, "%s", err);
    if (khub_hub_new(NULL, hub) != KHUB_STATUS_OK)
        return khub_cli_fail(cmd, "%s", khub_last_error());
    if (khub_hub_resolve(*hub, id, commit) != KHUB_STATUS_OK) {
        khub_cli_fail(cmd, "%s", khub_hub_errmsg(*hub));
        khub_hub_free(*hub);
        return 1;
    }
    return 0;
}

/* "12.3 MiB" */
static void human_bytes(double b, char *out, size_t n)
{
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) b /= 1024, i++;
    snprintf(out, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

/* The progress bar on a terminal: bytes, rate and ETA, at most 10 updates
 * a second (and always the last). */
static void progress(void *ud, const char *path, uint64_t done, uint64_t total)
{
    static struct timespec t0, shown;
    static const char *last;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (last != path) t0 = now, shown = (struct timespec){0, 0}, last = path;
    double since =
        (double)(now.tv_sec - shown.tv_sec) + (double)(now.tv_nsec - shown.tv_nsec) / 1e9;
    if (done != total && since < 0.1) return;
    shown = now;
    double s = (double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) / 1e9;
    double rate = s > 1e-3 ? (double)done / s : 0; /* none yet from a first piece */
    char d[32], t[32], r[32] = "-", eta[32] = "-";
    human_bytes((double)done, d, sizeof d);
    human_bytes((double)total, t, sizeof t);
    if (rate > 0) {
        human_bytes(rate, r, sizeof r);
        snprintf(r + strlen(r), sizeof r - strlen(r), "/s");
        snprintf(eta, sizeof eta, "%.0fs", total > done ? (double)(total - done) / rate : 0);
    }
    fprintf(stderr, "\r%-40.40s %10s / %-10s %12s ETA %5s", path, d, t, r, eta);
    if (done == total) fputc('\n', stderr);
    (void)ud;
}

static const khub_cli_cmd resolve_cmd;
static int run_resolve(int argc, char **argv)
{
    if (khub_cli_wants_help(&resolve_cmd, argc, argv)) return 0;
    hub_args a;
    int rc = parse_common(&resolve_cmd, argc, argv, &a);
    if (rc) return rc;
    khub_hub_id id;
    khub_hub *hub;
    char commit[41];
    if ((rc = open_hub("resolve", &a, &id, &hub, commit))) return rc;
    if (a.json) {
        char full[256];
        snprintf(full, sizeof full, "%s/%s", id.org, id.name);
        printf("{\"id\":");
        khub_cli_json_str(full);
        printf(",\"revision\":");
        khub_cli_json_str(id.revision);
        printf(",\"commit\":\"%s\"}\n", commit);
    } else
        printf("%s\n", commit);
    khub_hub_free(hub);
    return 0;
}

static const khub_cli_cmd resolve_cmd = {
    "resolve", "resolve a Hub ID's revision to a commit",
    "usage: khub resolve ID [--json]\n\n"
    "Resolves org/name[@REV|@version=N] to a 40-hex commit and records it in the\n"
    "cache's refs/. Offline (HF_HUB_OFFLINE=1) it reads refs/ only.\n"
    "--json  one object {id, revision, commit} instead of the commit alone.\n",
    run_resolve};
KHUB_CLI_COMMAND(resolve_cmd)

static const khub_cli_cmd variants_cmd;
static int run_variants(int argc, char **argv)
{
    if (khub_cli_wants_help(&variants_cmd, argc, argv)) return 0;
    hub_args a;
    int rc = parse_common(&variants_cmd, argc, argv, &a);
    if (rc) return rc;
    khub_hub_id id;
    khub_hub *hub;
    char commit[41];
    if ((rc = open_hub("variants", &a, &id, &hub, commit))) return rc;
    khub_hub_variant_list *vl = NULL;
    if (khub_hub_variants(hub, &id, commit, &vl) != KHUB_STATUS_OK) {
        rc = khub_cli_fail("variants", "%s", khub_hub_errmsg(hub));
        khub_hub_free(hub);
        return rc;
    }
    if (a.json) printf("[");
    for (size_t i = 0; i < vl->count; i++) {
        const khub_hub_variant *v = &vl->items[i];
        if (a.json) {
            printf("%s{\"name\":", i ? "," : "");
            khub_cli_json_str(v->name);
            printf(",\"accepted\":%s,\"reason\":", v->accepted ? "true" : "false");
            khub_cli_json_str(v->reason);
            printf("}");
        } else
            printf("%s %-44s %s\n", vl->best && !strcmp(vl->best, v->name) ? "*" : " ", v->name,
                   v->reason);
    }
    if (a.json) printf("]\n");
    khub_hub_variant_list_free(vl);
    khub_hub_free(hub);
    return 0;
}

static const khub_cli_cmd variants_cmd = {
    "variants", "list a kernel's build variants and which fits this machine",
    "usage: khub variants ID [--json]\n\n"
    "Lists build/<variant>/ at the resolved commit with accept/reject reasons;\n"
    "the preferred variant is marked '*'.\n"
    "--json  an array of {name, accepted, reason} instead.\n",
    run_variants};
KHUB_CLI_COMMAND(variants_cmd)

/* One downloaded file as a JSON line; NULL fields are left out. */
static void print_file_json(const char *variant, const char *file, const char *path,
                            const char *sha256)
{
    printf("{");
    if (variant) {
        printf("\"variant\":");
        khub_cli_json_str(variant);
        printf(",");
    }
    printf("\"file\":");
    khub_cli_json_str(file);
    printf(",\"path\":");
    khub_cli_json_str(path);
    if (sha256) printf(",\"sha256\":\"%s\"", sha256);
    printf("}\n");
}

static const khub_cli_cmd download_cmd;
static int run_download(int argc, char **argv)
{
    if (khub_cli_wants_help(&download_cmd, argc, argv)) return 0;
    hub_args a;
    int rc = parse_common(&download_cmd, argc, argv, &a);
    if (rc) return rc;
    khub_hub_id id;
    khub_hub *hub;
    char commit[41];
    if (a.file && (a.variant || a.all))
        return khub_cli_usage(&download_cmd, "--file goes alone, without --variant/--all-variants");
    if ((rc = open_hub("download", &a, &id, &hub, commit))) return rc;
    if (!a.quiet && isatty(2)) khub_hub_set_progress(hub, progress, NULL);
    if (a.file) {
        char *path = NULL;
        if (khub_hub_download_file(hub, &id, commit, a.file, &path) != KHUB_STATUS_OK)
            rc = khub_cli_fail("download", "%s", khub_hub_errmsg(hub));
        else if (!a.quiet && a.json)
            print_file_json(NULL, a.file, path, NULL);
        else if (!a.quiet)
            printf("%s %s\n", a.file, path);
        free(path);
        khub_hub_free(hub);
        return rc;
    }
    khub_hub_variant_list *vl = NULL;
    if (khub_hub_variants(hub, &id, commit, &vl) != KHUB_STATUS_OK) {
        rc = khub_cli_fail("download", "%s", khub_hub_errmsg(hub));
        goto done;
    }
    size_t fetched = 0;
    for (size_t i = 0; i < vl->count; i++) {
        const char *v = vl->items[i].name;
        int pick = a.variant ? !strcmp(v, a.variant)
                   : a.all   ? !strncmp(v, "khub", 4)
                             : vl->best && !strcmp(v, vl->best);
        if (!pick) continue;
        khub_hub_file_list *fl = NULL;
        if (khub_hub_download_variant(hub, &id, commit, v, &fl) != KHUB_STATUS_OK) {
            rc = khub_cli_fail("download", "%s", khub_hub_errmsg(hub));
            goto done;
        }
        for (size_t k = 0; k < fl->count && !a.quiet; k++) {
            const khub_hub_file *f = &fl->items[k];
            if (a.json)
                print_file_json(v, f->rel, f->path, f->sha256);
            else
                printf("%s %s %s %s\n", v, f->rel, f->path, f->sha256);
        }
        khub_hub_file_list_free(fl);
        fetched++;
        if (!a.all) goto done;
    }
    if (a.all && !fetched)
        rc = khub_cli_fail("download", "%s has no khub variant at %.12s; see khub variants %s",
                           a.id_text, commit, a.id_text);
    else if (!a.all)
        rc = khub_cli_fail("download",
                           "no variant %s fits this machine; see khub "
                           "variants %s",
                           a.variant ? a.variant : "", a.id_text);
done:
    khub_hub_variant_list_free(vl);
    khub_hub_free(hub);
    return rc;
}

static const khub_cli_cmd download_cmd = {
    "download", "download and verify a kernel variant into the cache",
    "usage: khub download ID [--variant V | --all-variants | --file PATH] [--json] [--quiet]\n\n"
    "Downloads the best variant for this machine (--variant V: that one; --all-variants:\n"
    "every khub variant), verifies each file against metadata.json and prints:\n"
    "variant file path sha256.\n"
    "--file PATH downloads that one repo file instead (checked against the hub's\n"
    "SHA-256 or git blob SHA-1) and prints: file path.\n"
    "--json  one object per file instead: {variant, file, path, sha256} ({file, path}\n"
    "        with --file).\n"
    "--quiet no progress bar (shown on a terminal otherwise) and no lines printed.\n",
    run_download};
KHUB_CLI_COMMAND(download_cmd)

static volatile sig_atomic_t stop_serving;
static void on_signal(int sig)
{
    (void)sig;
    stop_serving = 1;
}

/* A whole number in lo..hi from an option value; -1 otherwise. */
static long option_number(const char *v, long lo, long hi)
{
    char *end = NULL;
    errno = 0;
    long n = strtol(v, &end, 10);
    return errno || end == v || *end || n < lo || n > hi ? -1 : n;
}

/* --log FILE: the server's access log callback, one line per request
 * appended to the file (the library writes no file of its own). */
static void serve_log_line(void *ud, khub_log_level level, const char *msg)
{
    (void)level;
    fprintf((FILE *)ud, "%s\n", msg);
    fflush((FILE *)ud);
}

static const khub_cli_cmd serve_cmd;
static int run_serve(int argc, char **argv)
{
    if (khub_cli_wants_help(&serve_cmd, argc, argv)) return 0;
    khub_server_opts o = {KHUB_APP_INIT(khub_server_opts)};
    const char *log_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--port") && i + 1 < argc) {
            long port = option_number(argv[++i], 0, 65535);
            if (port < 0)
                return khub_cli_usage(&serve_cmd, "--port %s is not a port number (0-65535)",
                                      argv[i]);
            o.port = (uint16_t)port;
        } else if (!strcmp(argv[i], "--host") && i + 1 < argc)
            o.host = argv[++i];
        else if (!strcmp(argv[i], "--fault") && i + 1 < argc)
            o.faults = argv[++i];
        else if (!strcmp(argv[i], "--log") && i + 1 < argc)
            log_path = argv[++i];
        else if (!strcmp(argv[i], "--token") && i + 1 < argc)
            o.token = argv[++i];
        else if (!strcmp(argv[i], "--page-size") && i + 1 < argc) {
            long n = option_number(argv[++i], 1, 1000000);
            if (n < 0)
                return khub_cli_usage(&serve_cmd, "--page-size %s is not a number in 1-1000000",
                                      argv[i]);
            o.page_size = (uint32_t)n;
        } else if (!strcmp(argv[i], "--max-connections") && i + 1 < argc) {
            long n = option_number(argv[++i], 1, 100000);
            if (n < 0)
                return khub_cli_usage(&serve_cmd,
                                      "--max-connections %s is not a number in 1-100000", argv[i]);
            o.max_connections = (uint32_t)n;
        } else if (!strcmp(argv[i], "--max-per-ip") && i + 1 < argc) {
            long n = option_number(argv[++i], 1, 100000);
            if (n < 0)
                return khub_cli_usage(&serve_cmd, "--max-per-ip %s is not a number in 1-100000",
                                      argv[i]);
            o.max_per_ip = (uint32_t)n;
        } else if (!strcmp(argv[i], "--idle-timeout") && i + 1 < argc) {
            long n = option_number(argv[++i], 1, 3600);
            if (n < 0)
                return khub_cli_usage(
                    &serve_cmd, "--idle-timeout %s is not a number of seconds in 1-3600", argv[i]);
            o.idle_timeout_s = (uint32_t)n;
        } else if (!strcmp(argv[i], "--max-body") && i + 1 < argc) {
            long n = option_number(argv[++i], 1, 16384);
            if (n < 0)
                return khub_cli_usage(&serve_cmd, "--max-body %s is not a number of MiB in 1-16384",
                                      argv[i]);
            o.max_body = (uint64_t)n << 20;
        } else if (argv[i][0] == '-')
            return khub_cli_usage(&serve_cmd, "unknown option %s", argv[i]);
        else if (!o.dir)
            o.dir = argv[i];
        else
            return khub_cli_usage(&serve_cmd, "unexpected argument %s", argv[i]);
    }
    if (!o.dir) return khub_cli_usage(&serve_cmd, "missing DIR");
    FILE *log = log_path ? fopen(log_path, "a") : NULL;
    if (log_path && !log)
        return khub_cli_fail("serve", "serve: cannot open log %s: %s", log_path, strerror(errno));
    o.log = log ? serve_log_line : NULL;
    o.log_ud = log;
    khub_server *s = NULL;
    char err[KHUB_ERROR_SIZE];
    if (khub_server_start(&o, &s, err, sizeof err) != KHUB_STATUS_OK) {
        if (log) fclose(log);
        return khub_cli_fail("serve", "%s", err);
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    printf("serving %s on http://%s:%u\n", o.dir, o.host ? o.host : "127.0.0.1",
           khub_server_port(s));
    fflush(stdout);
    while (!stop_serving) pause();
    khub_server_stop(s);
    if (log) fclose(log);
    return 0;
}

static const khub_cli_cmd serve_cmd = {
    "serve", "serve a folder of kernel repos as a local Hub",
    "usage: khub serve DIR [--port N] [--host 127.0.0.1] [--log FILE] [--page-size N]\n"
    "                      [--token T] [--fault LIST] [--max-connections N]\n"
    "                      [--max-per-ip N] [--idle-timeout S] [--max-body MIB]\n\n"
    "Serves DIR/<org>/<name>/{refs.json,commits/<sha>/...} (docs/hub-server.md) with\n"
    "the Hub's read endpoints; point HF_ENDPOINT at it. Binds to loopback unless\n"
    "--host says otherwise; --port 0 (default) picks a free port, printed on stdout.\n"
    "--log FILE appends a line per request (method, path, auth, range, user agent);\n"
    "--page-size N entries per page of a tree listing (default 1000).\n"
    "It also takes uploads (repos/create, preupload, LFS, commit, branch, tag); with\n"
    "--token T every write needs 'Authorization: Bearer T' (reads stay open); a write\n"
    "without it is answered 401 without its body being stored (at the headers when large).\n"
    "Limits: --max-connections N open connections (default 512), --max-per-ip N per\n"
    "client address (64), --idle-timeout S closes a connection silent for S seconds\n"
    "(15), --max-body MIB caps a write's body (64; 413 when over, other bodies 1 MiB).\n"
    "--fault (or KHUB_SERVE_FAULTS) injects test faults: drop-body[=N], short-body,\n"
    "extra-bytes, wrong-hash, 429[=N], ratelimit[=N], 503[=N], 408[=N], gated, redirect-loop,\n"
    "cross-host, moved, tree-dotdot, tree-absolute, wrong-commit, link-away, link-userinfo,\n"
    "ignore-range, rate=MIB_PER_S (every GET body paced to that speed, as over a real link),\n"
    "trickle=BYTES_PER_S (a few bytes at a time);\n"
    "docs/hub-server.md has the table.\n",
    run_serve};
KHUB_CLI_COMMAND(serve_cmd)
