/*
 * cmd_publish.c: `khub publish DIR`: uploads DIR/build/ to branch
 * v<major> of the kernel's Hub repo (khub_author_publish; hub/publish.h
 * has the protocol).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "khub/khub_author.h"
#include "khub/khub_hub.h"

static void progress(void *ud, const char *path, uint64_t done, uint64_t total)
{
    (void)ud;
    fprintf(stderr, "\r%-50.50s %12llu/%llu bytes", path, (unsigned long long)done,
            (unsigned long long)total);
    if (done == total) fputc('\n', stderr);
}

static const khub_cli_cmd publish_cmd;
static int run_publish(int argc, char **argv)
{
    if (khub_cli_wants_help(&publish_cmd, argc, argv)) return 0;
    khub_author_publish_opts po = {KHUB_APP_INIT(khub_author_publish_opts)};
    khub_hub_opts ho = {KHUB_STRUCT_INIT(khub_hub_opts), .offline = 0};
    int json = 0, quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (!strcmp(a, "--json"))
            json = 1;
        else if (!strcmp(a, "--quiet") || !strcmp(a, "-q"))
            quiet = 1;
        else if (!strcmp(a, "--repo") && more)
            po.repo = argv[++i];
        else if (!strcmp(a, "--endpoint") && more)
            ho.endpoint = argv[++i];
        else if (!strcmp(a, "--token") && more)
            ho.token = argv[++i];
        else if ((!strcmp(a, "--message") || !strcmp(a, "-m")) && more)
            po.message = argv[++i];
        else if (a[0] == '-')
            return khub_cli_usage(&publish_cmd, "unknown option %s", a);
        else if (!po.dir)
            po.dir = a;
        else
            return khub_cli_usage(&publish_cmd, "unexpected argument %s", a);
    }
    if (!po.dir)
        return khub_cli_usage(&publish_cmd, "missing DIR (a kernel tree built with "
                                            "khub build)");
    khub_hub *hub = NULL;
    if (khub_hub_new(&ho, &hub) != KHUB_STATUS_OK)
        return khub_cli_fail("publish", "%s", khub_last_error());
    if (!quiet && !json && isatty(2)) khub_hub_set_progress(hub, progress, NULL);
    khub_author_publish_result res = {KHUB_APP_INIT(khub_author_publish_result)};
    khub_status st = khub_author_publish(hub, &po, &res);
    if (st != KHUB_STATUS_OK) {
        int rc = khub_cli_fail("publish", "%s", khub_hub_errmsg(hub));
        khub_hub_free(hub);
        return rc;
    }
    if (json) {
        printf("{\"repo\":");
        khub_cli_json_str(res.repo);
        printf(",\"branch\":");
        khub_cli_json_str(res.branch);
        printf(",\"version\":");
        khub_cli_json_str(res.version);
        printf(",\"commit\":\"%s\","
               "\"changed\":%s,\"files\":%llu,\"unchanged\":%llu,\"uploaded\":%llu,"
               "\"already_stored\":%llu,\"deleted\":%llu,\"created_repo\":%s,"
               "\"created_branch\":%s}\n",
               res.commit, res.changed ? "true" : "false", (unsigned long long)res.n_files,
               (unsigned long long)res.n_unchanged, (unsigned long long)res.n_uploaded,
               (unsigned long long)res.n_lfs_stored, (unsigned long long)res.n_deleted,
               res.created_repo ? "true" : "false", res.created_branch ? "true" : "false");
    } else {
        if (!quiet)
            fprintf(stderr,
                    "%s %s -> %s@%s: %llu files, %llu unchanged, %llu uploaded, %llu "
                    "deleted%s\n",
                    po.dir, res.version, res.repo, res.branch, (unsigned long long)res.n_files,
                    (unsigned long long)res.n_unchanged, (unsigned long long)res.n_uploaded,
                    (unsigned long long)res.n_deleted,
                    res.changed ? "" : " (no changes since the last publish)");
        printf("%s\n", res.commit);
    }
    khub_hub_free(hub);
    return 0;
}

static const khub_cli_cmd publish_cmd = {
    "publish", "upload a built kernel to its Hub repo (branch v<major>)",
    "usage: khub publish DIR [--repo ORG/NAME] [--endpoint URL] [--token T]\n"
    "                        [--message M] [--json] [--quiet]\n\n"
    "Uploads DIR/build/<variant>/ and DIR/build/<variant>.tar.gz (made by 'khub build\n"
    "DIR', signed or not) to branch v<major> of kernel.json's repo, as one commit:\n"
    "the repo and branch are created when missing, binaries and archives go through\n"
    "Git LFS, and files under build/ that the build no longer has are deleted.\n"
    "Prints the commit id (the unchanged head when nothing changed).\n\n"
    "The endpoint is --endpoint, else HF_ENDPOINT, else https://huggingface.co. The\n"
    "token is --token, else HF_TOKEN, else the HF_TOKEN_PATH or HF_HOME token file;\n"
    "it is sent to the endpoint's host only (never to upload URLs elsewhere).\n\n"
    "  --repo ORG/NAME  upload to this repo instead of kernel.json's\n"
    "  --message M      the commit summary (default 'Upload ORG/NAME VERSION (khub publish)')\n"
    "  --json           one object {repo, branch, version, commit, changed, files, unchanged,\n"
    "                   uploaded, already_stored, deleted, created_repo, created_branch}\n"
    "  --quiet          no progress bar and no summary line on stderr\n",
    run_publish};
KHUB_CLI_COMMAND(publish_cmd)
