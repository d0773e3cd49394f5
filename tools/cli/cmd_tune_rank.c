/*
 * cmd_tune_rank.c: `khub tune-rank --tp N SPEC`, hidden: one rank of the
 * job that `khub tune` starts under mpirun to measure its parallelism lever
 * (khub_tune_rank_load / khub_tune_rank_measure in khub_tune.h), on the
 * lifecycle every `--tp` command shares (tp_job.h): every rank loads, ranks
 * > 0 follow rank 0's steps, rank 0 measures and writes the result file
 * that khub tune reads. Not for people: khub tune writes SPEC.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "khub/khub_tune.h"
#include "tp_job.h"

static const khub_cli_cmd tune_rank_cmd;

static int tune_rank(int argc, char **argv)
{
    if (khub_cli_wants_help(&tune_rank_cmd, argc, argv)) return 0;
    char *end = NULL;
    long tp = argc == 4 && !strcmp(argv[1], "--tp") ? strtol(argv[2], &end, 10) : 0;
    if (!end || *end || tp < 2 || tp > 64)
        return khub_cli_usage(&tune_rank_cmd, "want --tp N (2..64) and a spec file");
    const char *spec = argv[3];
    cli_tp_job job;
    int rc = cli_tp_begin(&job, "tune-rank", (int)tp, 0);
    if (rc) return rc;
    char err[KHUB_ERROR_SIZE];
    khub_runtime *rt = NULL;
    khub_model *m = NULL;
    if (khub_tune_rank_load(spec, cli_tp_comm(&job), &rt, &m, err, sizeof err) != KHUB_STATUS_OK)
        return cli_tp_end(&job, khub_cli_fail("tune-rank", "rank %d: %s", (int)job.comm.rank, err));
    if (job.comm.rank != 0) return cli_tp_end(&job, cli_tp_follow(&job, rt, m));
    if (khub_tune_rank_measure(spec, m, err, sizeof err) != KHUB_STATUS_OK)
        rc = khub_cli_fail("tune-rank", "%s", err);
    cli_tp_abort_if(&job, rc);
    khub_model_free(m);
    khub_runtime_free(rt);
    return cli_tp_end(&job, rc);
}

static const khub_cli_cmd tune_rank_cmd = {
    "tune-rank", NULL, /* hidden: not in `khub --help` */
    "usage: khub tune-rank --tp N SPEC   (started by khub tune under mpirun)\n"
    "\n"
    "One rank of the job that `khub tune` runs to measure tensor parallelism\n"
    "(docs/tune.md); SPEC is the file khub tune writes.\n",
    tune_rank};

KHUB_CLI_COMMAND(tune_rank_cmd)
