/*
 * cmd_plugins.c: `khub plugins` (what is loaded) and `khub check FILE`
 * (inspect a plugin without loading it, then load it and run its self-test
 * in a child process, so a crashing plugin is reported, not fatal).
 */
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "check_kernel.h"
#include "cli.h"
#include "khub/khub_check.h"

/* ======================================================================== */
/* Names                                                                    */
/* ======================================================================== */

/* The names of a CPU feature mask, comma-separated. */
static void cpu_feature_names(uint32_t bits, char *buf, size_t n)
{
    khub_cpu_feature_names(bits, ",", buf, n);
}

static void dtype_names(uint64_t mask, char *buf, size_t n)
{
    buf[0] = '\0';
    for (int id = 0; id < 64; id++) {
        if (!(mask & (UINT64_C(1) << id)) || !khub_dtype_id_name(id)) continue;
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, "%s%s", len ? "," : "", khub_dtype_id_name(id));
    }
}

/* The op's capability flags (the host's copy: the 1.0 word and its kind's). */
static void flag_names(const khub_op_desc *op, char *buf, size_t n)
{
    khub_cap_flag_names(op->kind, op->caps->kind_flags, ",", buf, n);
}

/* ======================================================================== */
/* khub plugins                                                             */
/* ======================================================================== */

/* The kinds p's ops serve, in kind order, comma-separated. */
static void plugin_kinds(const khub_plugin *p, char *buf, size_t n)
{
    uint32_t mask = 0;
    for (uint32_t i = 0; i < khub_plugin_op_count(p); i++) {
        uint32_t k = khub_plugin_op(p, i)->kind;
        if (k < 32) mask |= 1u << k;
    }
    buf[0] = '\0';
    for (uint32_t k = 1; k < KHUB_OP_KIND__COUNT; k++) {
        if (!(mask & (1u << k))) continue;
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, "%s%s", len ? "," : "", khub_op_kind_name(k));
    }
}

static cJSON *op_json(const khub_op_desc *op)
{
    char buf[256];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", op->name);
    cJSON_AddStringToObject(o, "kind", khub_op_kind_name(op->kind));
    const khub_op_caps *c = op->caps;
    cJSON_AddStringToObject(o, "device", c->device_type == KHUB_DEVICE_CUDA ? "cuda" : "cpu");
    dtype_names(c->dtypes, buf, sizeof buf);
    cJSON_AddStringToObject(o, "dtypes", buf);
    cpu_feature_names(c->cpu_features, buf, sizeof buf);
    cJSON_AddStringToObject(o, "cpu_features", buf);
    flag_names(op, buf, sizeof buf);
    cJSON_AddStringToObject(o, "flags", buf);
    dtype_names(c->act_dtypes, buf, sizeof buf);
    cJSON_AddStringToObject(o, "act_dtypes", buf);
    cJSON *hd = cJSON_AddArrayToObject(o, "head_dims");
    for (uint32_t i = 0; c->head_dims && i < c->n_head_dims; i++)
        cJSON_AddItemToArray(hd, cJSON_CreateNumber(c->head_dims[i]));
    if (c->cc_min) {
        cJSON_AddNumberToObject(o, "cc_min", c->cc_min);
        cJSON_AddNumberToObject(o, "cc_max", c->cc_max);
        cJSON_AddNumberToObject(o, "ptx_isa", c->ptx_isa);
    }
    cJSON_AddNumberToObject(o, "priority", c->priority);
    return o;
}

static cJSON *plugin_json(const khub_plugin *p)
{
    uint16_t maj, min;
    khub_plugin_abi(p, &maj, &min);
    char abi[16];
    snprintf(abi, sizeof abi, "%u.%u", maj, min);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", khub_plugin_id(p));
    cJSON_AddStringToObject(o, "version", khub_plugin_version(p));
    cJSON_AddStringToObject(o, "abi", abi);
    char kinds[128];
    plugin_kinds(p, kinds, sizeof kinds);
    cJSON_AddStringToObject(o, "kinds", kinds);
    cJSON_AddStringToObject(o, "file", khub_plugin_path(p));
    cJSON_AddStringToObject(o, "sha256", khub_plugin_sha256(p));
    cJSON *ops = cJSON_AddArrayToObject(o, "ops");
    for (uint32_t i = 0; i < khub_plugin_op_count(p); i++)
        cJSON_AddItemToArray(ops, op_json(khub_plugin_op(p, i)));
    return o;
}

static void print_plugin_text(const khub_plugin *p)
{
    uint16_t maj, min;
    khub_plugin_abi(p, &maj, &min);
    char kinds[128];
    plugin_kinds(p, kinds, sizeof kinds);
    printf("%s %s (ABI %u.%u)\n  kinds  %s\n  file   %s\n  sha256 %s\n", khub_plugin_id(p),
           khub_plugin_version(p), maj, min, kinds[0] ? kinds : "-", khub_plugin_path(p),
           khub_plugin_sha256(p));
    for (uint32_t i = 0; i < khub_plugin_op_count(p); i++) {
        const khub_op_desc *op = khub_plugin_op(p, i);
        const khub_op_caps *c = op->caps;
        char dt[256], cpu[128], fl[128];
        dtype_names(c->dtypes, dt, sizeof dt);
        cpu_feature_names(c->cpu_features, cpu, sizeof cpu);
        flag_names(op, fl, sizeof fl);
        printf("  op %-14s %-10s %s dtypes=%s", op->name, khub_op_kind_name(op->kind),
               c->device_type == KHUB_DEVICE_CUDA ? "cuda" : "cpu", dt[0] ? dt : "-");
        if (cpu[0]) printf(" cpu=%s", cpu);
        if (fl[0]) printf(" flags=%s", fl);
        if (c->head_dims && c->n_head_dims) {
            printf(" head_dims=");
            for (uint32_t h = 0; h < c->n_head_dims; h++)
                printf("%s%d", h ? "," : "", c->head_dims[h]);
        }
        if (c->cc_min) printf(" cc=%u-%u ptx_isa=%u", c->cc_min, c->cc_max, c->ptx_isa);
        printf(" priority=%d\n", c->priority);
    }
}

static const khub_cli_cmd cmd_plugins;

static int run_plugins(int argc, char **argv)
{
    if (khub_cli_wants_help(&cmd_plugins, argc, argv)) return 0;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else
            return khub_cli_usage(&cmd_plugins, "unknown argument '%s'", argv[i]);
    }
    khub_runtime *rt = khub_cli_runtime("plugins", 1);
    if (!rt) return 1;
    size_t n = khub_plugin_count(rt);
    if (json) {
        cJSON *arr = cJSON_CreateArray();
        for (size_t i = 0; i < n; i++)
            cJSON_AddItemToArray(arr, plugin_json(khub_plugin_at(rt, i)));
        char *s = cJSON_Print(arr);
        printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(arr);
    } else {
        for (size_t i = 0; i < n; i++) print_plugin_text(khub_plugin_at(rt, i));
        if (n == 0) printf("no plugins loaded\n");
    }
    khub_runtime_free(rt);
    return 0;
}

static const khub_cli_cmd cmd_plugins = {
    "plugins", "list the loaded plugins, their ops and capabilities",
    "usage: khub plugins [--json]\n\n"
    "Loads the built-in plugins (verified against their manifest) and lists each:\n"
    "id, version, ABI, the op kinds it serves, source file, SHA-256, and every op\n"
    "with its kind, device, dtypes, CPU features, flags, head dims, CUDA range\n"
    "and priority.\n\n"
    "  --json   print a JSON array instead of text\n"
    "Environment: KHUB_PLUGIN_DIR overrides the built-in plugin directory.\n",
    run_plugins};
KHUB_CLI_COMMAND(cmd_plugins)

/* ======================================================================== */
/* khub check                                                               */
/* ======================================================================== */

static const khub_cli_cmd cmd_check;

/* A report line's whole text: "FILE: message" or "message". */
static void line_text(const khub_check_finding *f, char *buf, size_t n)
{
    snprintf(buf, n, "%s%s%s", f->file, f->file[0] ? ": " : "", f->message);
}

/* The ABI gate's lines of a FILE check: a violation without the file's name,
 * or the whole line when the gate could not read the file. */
static const char *gate_line(const khub_check_finding *f, char *buf, size_t n)
{
    if (f->severity != KHUB_CHECK_FAIL || f->code < KHUB_CHECK_GATE_UNREADABLE ||
        f->code > KHUB_CHECK_GATE_ENTRY)
        return NULL;
    if (f->code != KHUB_CHECK_GATE_UNREADABLE) return f->message;
    line_text(f, buf, n);
    return buf;
}

/* The child's line, or why it did not run ("(--sha256)": the option named). */
static void load_line(const khub_check_report *rep, char *buf, size_t n)
{
    snprintf(buf, n, "%s%s", rep->load_report,
             !rep->loaded && rep->load_status == KHUB_STATUS_DIGEST_MISMATCH ? " (--sha256)" : "");
}

static void print_check_json(const char *path, const khub_check_report *rep)
{
    const khub_plugin_info *info = rep->info;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "file", path);
    cJSON_AddBoolToObject(o, "ok", rep->n_failed == 0);
    cJSON_AddStringToObject(o, "inspect", khub_status_name(rep->inspect_status));
    char buf[KHUB_ERROR_SIZE + 2400];
    if (!info) {
        line_text(khub_check_report_finding(rep, 0), buf, sizeof buf);
        cJSON_AddStringToObject(o, "error", buf);
    } else {
        char abi[16];
        snprintf(abi, sizeof abi, "%u.%u", info->plugin_abi_major, info->plugin_abi_minor);
        cJSON_AddStringToObject(o, "id", info->full_id);
        cJSON_AddStringToObject(o, "version", info->version);
        cJSON_AddStringToObject(o, "abi", abi);
        cJSON_AddStringToObject(o, "sha256", info->sha256);
        cJSON_AddStringToObject(o, "load",
                                rep->loaded || rep->load_status != KHUB_STATUS_OK
                                    ? khub_status_name(rep->load_status)
                                    : "skipped");
        load_line(rep, buf, sizeof buf);
        cJSON_AddStringToObject(o, "report", buf);
        cJSON_AddStringToObject(o, "gate", khub_status_name(rep->gate_status));
        cJSON *fa = cJSON_AddArrayToObject(o, "gate_findings");
        for (size_t i = 0; i < rep->n_findings; i++) {
            const char *g = gate_line(khub_check_report_finding(rep, i), buf, sizeof buf);
            if (g) cJSON_AddItemToArray(fa, cJSON_CreateString(g));
        }
        cJSON_AddStringToObject(o, "max_glibc", rep->max_glibc);
    }
    char *s = cJSON_Print(o);
    printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(o);
}

static void print_check_text(const char *path, const khub_check_report *rep, const char *ceiling)
{
    const khub_plugin_info *info = rep->info;
    char buf[KHUB_ERROR_SIZE + 2400];
    if (!info) {
        line_text(khub_check_report_finding(rep, 0), buf, sizeof buf);
        printf("FAIL %s: %s\n", path, buf);
        return;
    }
    printf("%s %s %s (ABI %u.%u)\n  sha256 %s\n", rep->n_failed ? "FAIL" : "ok  ", info->full_id,
           info->version, info->plugin_abi_major, info->plugin_abi_minor, info->sha256);
    load_line(rep, buf, sizeof buf);
    if (buf[0]) printf("  %s\n", buf);
    for (size_t i = 0; i < rep->n_findings; i++) {
        const char *g = gate_line(khub_check_report_finding(rep, i), buf, sizeof buf);
        if (g) printf("  ABI gate: %s\n", g);
    }
    if (rep->gate_status == KHUB_STATUS_OK)
        printf("  ABI gate passed (glibc %s, ceiling %s)\n",
               rep->max_glibc[0] ? rep->max_glibc : "none", ceiling ? ceiling : "GLIBC_2.28");
}

static int run_check(int argc, char **argv)
{
    if (khub_cli_wants_help(&cmd_check, argc, argv)) return 0;
    const char *path = NULL, *digest = NULL, *ceiling = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (strcmp(argv[i], "--sha256") == 0 && i + 1 < argc)
            digest = argv[++i];
        else if (strcmp(argv[i], "--glibc-ceiling") == 0 && i + 1 < argc)
            ceiling = argv[++i];
        else if (argv[i][0] == '-')
            return khub_cli_usage(&cmd_check, "unknown option '%s'", argv[i]);
        else if (!path)
            path = argv[i];
        else
            return khub_cli_usage(&cmd_check, "more than one FILE");
    }
    if (!path) return khub_cli_usage(&cmd_check, "missing FILE or DIR");
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if (json) return khub_cli_usage(&cmd_check, "--json is for FILE checks");
        if (ceiling)
            return khub_cli_usage(&cmd_check,
                                  "--glibc-ceiling is for FILE checks (a kernel tree sets "
                                  "\"glibc_ceiling\" in kernel.json)");
        return khub_cli_check_kernel_dir(path);
    }
    if (ceiling && (strncmp(ceiling, "GLIBC_", 6) != 0 || ceiling[6] < '0' || ceiling[6] > '9'))
        return khub_cli_usage(&cmd_check, "--glibc-ceiling '%s' is not like GLIBC_2.28", ceiling);

    khub_check_opts opts = {KHUB_STRUCT_INIT(khub_check_opts), .glibc_ceiling = ceiling,
                            .sha256 = digest};
    khub_check_report *rep = NULL;
    char err[KHUB_ERROR_SIZE];
    if (khub_check_file(path, &opts, &rep, err, sizeof err) != KHUB_STATUS_OK)
        return khub_cli_fail("check", "%s", err);
    int ok = rep->n_failed == 0;
    if (json)
        print_check_json(path, rep);
    else
        print_check_text(path, rep, ceiling);
    khub_check_report_free(rep);
    return ok ? 0 : 1;
}

static const khub_cli_cmd cmd_check = {
    "check", "gate a plugin file or a built kernel tree: inspect, load, self-test in a child",
    "usage: khub check FILE [--sha256 HEX] [--glibc-ceiling GLIBC_X.Y] [--json]\n"
    "       khub check DIR\n\n"
    "Reads FILE's ELF header and khub ABI note without running any of its code\n"
    "and checks them against this host (architecture, ABI version, pointer size)\n"
    "and the ABI gate (below). Only if those pass, in a child process (timed by\n"
    "this one, 60 s or KHUB_CHECK_TIMEOUT_S), it loads exactly the bytes the gate\n"
    "read (their digest), negotiates, initialises the plugin and runs its\n"
    "self-test; a crash there is reported, not fatal. The child's verdict is\n"
    "authenticated, and one that plugin code wrote is refused; but a plugin's\n"
    "code can do anything its process can, so a passing check is evidence that\n"
    "it works, not proof that it is harmless (docs/kernel-format.md, Threat model).\n\n"
    "With a kernel source DIR (after 'khub build DIR'), runs the publish-time gate\n"
    "on every variant: metadata.json digests, the ABI gate on every .so (only the\n"
    "entry exported, allowed libraries, glibc <= 2.28 or kernel.json's\n"
    "\"glibc_ceiling\", no RPATH/RUNPATH, no\n"
    "NODELETE or GNU_UNIQUE, ABI note = metadata), PTX .target/.version =\n"
    "metadata, and the manifest's self-tests against khub/ref-cpu in a child.\n\n"
    "  --sha256 HEX   expected digest (default: the digest of the file as read)\n"
    "  --glibc-ceiling GLIBC_X.Y  newest glibc symbol version allowed (GLIBC_2.28)\n"
    "  --json         print a JSON object\n"
    "Exit status: 0 when every check passed, 1 otherwise, 2 on usage errors.\n",
    run_check};
KHUB_CLI_COMMAND(cmd_check)
