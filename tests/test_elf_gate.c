/*
 * test_elf_gate.c: the publish-time ABI gate, on plugins compiled by the
 * test itself (cc -shared) so that each one carries exactly one violation
 * and no sanitizer runtime: an extra export, a too-new glibc symbol, an
 * RPATH, a RUNPATH, NODELETE, a GNU_UNIQUE symbol, a library off the
 * allow-list, an unversioned import, no ABI note. Each must produce its own finding.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "elf_gate.h"
#include "runner.h"

static char workdir[256];

static const char *plugin_src =
    "#include <khub/khub_plugin.h>\n"
    "static khub_status init(const khub_host_api *h, khub_plugin_desc *o, char *e, size_t n)\n"
    "{ (void)h; (void)e; (void)n;\n"
    "  khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc), .id = \"t/gate\",\n"
    "                        .version = \"1.0.0\"};\n"
    "  return khub_plugin_desc_put(o, &d); }\n"
    "KHUB_PLUGIN_DEFINE(init, \"t/gate\", \"1.0.0\")\n";

/* Compiles plugin_src plus `extra_src` with `flags` into workdir/name.so. */
static void build(const char *name, const char *extra_src, const char *flags, char *out, size_t n)
{
    if (!workdir[0]) {
        snprintf(workdir, sizeof workdir, "/tmp/khub-gate-XXXXXX");
        ASSERT(mkdtemp(workdir) != NULL);
    }
    char src[512], cmd[2048];
    snprintf(src, sizeof src, "%s/%s.c", workdir, name);
    FILE *f = fopen(src, "w");
    ASSERT(f != NULL);
    fprintf(f, "%s%s\n", plugin_src, extra_src ? extra_src : "");
    fclose(f);
    snprintf(out, n, "%s/%s.so", workdir, name);
    snprintf(cmd, sizeof cmd,
             "cc -std=gnu11 -shared -fPIC -fvisibility=hidden -DKHUB_PLUGIN_MODULE -I%s/abi %s "
             "-o %s %s 2>&1",
             KHUB_SOURCE_DIR, src, out, flags ? flags : "");
    if (system(cmd) != 0) TEST_SKIP("no working C compiler for gate fixtures: %s", cmd);
}

static void expect_finding(const char *path, const char *needle)
{
    khub_gate_report rep;
    char err[KHUB_ERROR_SIZE] = "";
    ASSERT_STATUS(khub__gate_check_file(path, NULL, &rep, err, sizeof err),
                  KHUB_STATUS_PLUGIN_INVALID);
    int found = 0;
    for (size_t i = 0; i < rep.n_findings; i++)
        if (strstr(rep.findings[i], needle)) found = 1;
    if (!found) {
        for (size_t i = 0; i < rep.n_findings; i++)
            fprintf(stderr, "  finding: %s\n", rep.findings[i]);
        TEST_FAIL_("no finding containing \"%s\" for %s", needle, path);
    }
    ASSERT_CONTAINS(err, "ABI gate finding");
}

TEST_IMPL(clean_plugin_passes)
{
    char so[512];
    build("clean", NULL, NULL, so, sizeof so);
    khub_gate_report rep;
    char err[KHUB_ERROR_SIZE] = "";
    khub_status st = khub__gate_check_file(so, NULL, &rep, err, sizeof err);
    for (size_t i = 0; i < rep.n_findings; i++) fprintf(stderr, "  finding: %s\n", rep.findings[i]);
    ASSERT_OK(st);
    ASSERT(rep.has_note);
    ASSERT_STR_EQ(rep.note.id, "t/gate");
    ASSERT_STR_EQ(rep.note.version, "1.0.0");
    ASSERT_EQ(rep.note.abi_major, KHUB_ABI_MAJOR);
}

TEST_IMPL(extra_export)
{
    char so[512];
    build("export",
          "__attribute__((visibility(\"default\"))) int leaked_helper(void) { return 1; }", NULL,
          so, sizeof so);
    expect_finding(so, "exports leaked_helper");
}

TEST_IMPL(glibc_too_new)
{
    char so[512];
    /* close_range appeared in GLIBC_2.34, above the default ceiling 2.28. */
    build("glibc", "#include <unistd.h>\nint use_it(void) { return close_range(100, 101, 0); }",
          "-D_GNU_SOURCE", so, sizeof so);
    expect_finding(so, "newer than the ceiling GLIBC_2.28");
    /* A higher ceiling accepts it. */
    khub_gate_policy pol = {.glibc_ceiling = "GLIBC_2.99"};
    khub_gate_report rep;
    char err[KHUB_ERROR_SIZE];
    ASSERT_OK(khub__gate_check_file(so, &pol, &rep, err, sizeof err));
    ASSERT(khub__glibc_version_cmp(rep.max_glibc, "GLIBC_2.34") >= 0);
}

TEST_IMPL(rpath_and_runpath)
{
    char so[512];
    build("rpath", NULL, "-Wl,--disable-new-dtags,-rpath,/opt/evil", so, sizeof so);
    expect_finding(so, "RPATH '/opt/evil'");
    build("runpath", NULL, "-Wl,--enable-new-dtags,-rpath,/opt/evil2", so, sizeof so);
    expect_finding(so, "RUNPATH '/opt/evil2'");
}

TEST_IMPL(nodelete)
{
    char so[512];
    build("nodelete", NULL, "-Wl,-z,nodelete", so, sizeof so);
    expect_finding(so, "NODELETE");
}

TEST_IMPL(gnu_unique)
{
    char so[512];
    build("unique",
          "__asm__(\".section .data\\n.globl uniq_obj\\n.type uniq_obj, @gnu_unique_object\\n"
          ".size uniq_obj, 4\\nuniq_obj: .long 1\\n.text\\n\");",
          NULL, so, sizeof so);
    expect_finding(so, "STB_GNU_UNIQUE");
}

TEST_IMPL(library_not_allowed)
{
    char so[512];
    build("libz", "#include <zlib.h>\nconst char *v(void) { return zlibVersion(); }",
          "-Wl,--no-as-needed -lz", so, sizeof so);
    expect_finding(so, "needs library libz.so.1");
}

TEST_IMPL(unversioned_import)
{
#ifdef KHUB_SANITIZER_BUILD
    TEST_SKIP("a sanitizer build does not apply the rule (its interceptors are unversioned)");
#endif
    char so[512];
    /* a runtime function the host executable would provide at dlopen */
    build("hostsym",
          "const char *khub_runtime_errmsg(const void *rt);\n"
          "const char *peek(void) { return khub_runtime_errmsg(0); }",
          NULL, so, sizeof so);
    expect_finding(so, "imports khub_runtime_errmsg without a symbol version");
}

TEST_IMPL(no_note)
{
    char so[512];
    build("nonote", NULL, "-UKHUB_PLUGIN_MODULE", so, sizeof so);
    expect_finding(so, "no .note.khub ABI note");
}

TEST_IMPL(not_elf_and_truncated)
{
    char path[512], err[KHUB_ERROR_SIZE];
    khub_gate_report rep;
    snprintf(path, sizeof path, "/tmp/khub-gate-text-%d", (int)getpid());
    FILE *f = fopen(path, "w");
    fputs("#!/bin/sh\necho not a plugin\n", f);
    fclose(f);
    ASSERT_STATUS(khub__gate_check_file(path, NULL, &rep, err, sizeof err), KHUB_STATUS_NOT_ELF);
    ASSERT_CONTAINS(err, "not an ELF file");
    unlink(path);
    ASSERT_STATUS(khub__gate_check_file("/nonexistent/x.so", NULL, &rep, err, sizeof err),
                  KHUB_STATUS_IO);
    ASSERT_CONTAINS(err, "cannot open");
}

TEST_IMPL(glibc_compare)
{
    ASSERT(khub__glibc_version_cmp("GLIBC_2.28", "GLIBC_2.28") == 0);
    ASSERT(khub__glibc_version_cmp("GLIBC_2.3.4", "GLIBC_2.28") < 0);
    ASSERT(khub__glibc_version_cmp("GLIBC_2.34", "GLIBC_2.28") > 0);
    ASSERT(khub__glibc_version_cmp("GLIBC_2.2.5", "GLIBC_2.2") > 0);
}

TEST_IMPL(ptx_directives)
{
    const char *ptx = "//\n// Generated by NVRTC\n.version 8.7\n.target sm_90a\n"
                      ".address_size 64\n";
    int isa = 0, sm = 0;
    char suffix = 'x';
    ASSERT_OK(khub__ptx_inspect(ptx, strlen(ptx), &isa, &sm, &suffix));
    ASSERT_EQ(isa, 87);
    ASSERT_EQ(sm, 90);
    ASSERT_EQ(suffix, 'a');
    const char *bad = ".version 8.7\n";
    ASSERT_STATUS(khub__ptx_inspect(bad, strlen(bad), &isa, &sm, &suffix), KHUB_STATUS_PARSE);
    const char *bad2 = ".version x\n.target sm_80\n";
    ASSERT_STATUS(khub__ptx_inspect(bad2, strlen(bad2), &isa, &sm, &suffix), KHUB_STATUS_PARSE);
}

/* ELF headers as NVRTC writes them (ABI version 8: SM in e_flags bits
 * 8-15) and as older toolchains do (version 7: bits 0-7). */
static void cuda_header(unsigned char h[64], int abiversion, uint32_t flags, unsigned machine)
{
    memset(h, 0, 64);
    memcpy(h, "\177ELF", 4);
    h[4] = 2;    /* ELFCLASS64 */
    h[5] = 1;    /* little-endian */
    h[7] = 0x41; /* CUDA */
    h[8] = (unsigned char)abiversion;
    h[18] = (unsigned char)machine, h[19] = (unsigned char)(machine >> 8);
    for (int i = 0; i < 4; i++) h[48 + i] = (unsigned char)(flags >> (8 * i));
}

TEST_IMPL(cubin_header)
{
    unsigned char h[64];
    int sm = 0;
    cuda_header(h, 8, 0x06005a04, 190);
    ASSERT_OK(khub__cubin_inspect(h, sizeof h, &sm));
    ASSERT_EQ(sm, 90);
    cuda_header(h, 7, 0x00560056, 190);
    ASSERT_OK(khub__cubin_inspect(h, sizeof h, &sm));
    ASSERT_EQ(sm, 86);
    cuda_header(h, 8, 0x06005a04, 62); /* x86-64 */
    ASSERT_STATUS(khub__cubin_inspect(h, sizeof h, &sm), KHUB_STATUS_WRONG_ARCH);
    cuda_header(h, 8, 0x06000004, 190); /* no SM */
    ASSERT_STATUS(khub__cubin_inspect(h, sizeof h, &sm), KHUB_STATUS_PARSE);
    ASSERT_STATUS(khub__cubin_inspect(h, 40, &sm), KHUB_STATUS_NOT_ELF);
    memcpy(h, "//PTX", 5);
    ASSERT_STATUS(khub__cubin_inspect(h, sizeof h, &sm), KHUB_STATUS_NOT_ELF);
}

#define TEST_LIST(X) \
    X(clean_plugin_passes) \
    X(extra_export) \
    X(glibc_too_new) \
    X(rpath_and_runpath) \
    X(nodelete) \
    X(gnu_unique) \
    X(library_not_allowed) \
    X(unversioned_import) \
    X(no_note) \
    X(not_elf_and_truncated) \
    X(glibc_compare) \
    X(ptx_directives) \
    X(cubin_header)
TEST_MAIN(TEST_LIST)
