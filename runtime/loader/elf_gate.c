/*
 * elf_gate.c: the ABI gate (see elf_gate.h for the rules and its callers).
 *
 * The file is read whole into memory and handed to libelf with elf_memory,
 * so every section access is bounds-checked by libelf against that buffer;
 * string offsets from the file go through elf_strptr, which checks them
 * against the string table. Nothing here maps or runs the plugin.
 */
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <gnu/libc-version.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "elf_gate.h"

#define MAX_PLUGIN_BYTES (1u << 30) /* a plugin over 1 GiB is refused */

const char *const khub__gate_default_libs[] = {
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
    "libgcc_s.so.1",
#ifdef KHUB_SANITIZER_BUILD
    /* A sanitizer build of khub (KHUB_SANITIZE) builds its own and its test
     * plugins against these runtimes; `khub build` never links them. */
    "libasan.so.8",
    "libubsan.so.1",
    "libtsan.so.2",
#endif
};
const size_t khub__gate_n_default_libs =
    sizeof khub__gate_default_libs / sizeof khub__gate_default_libs[0];

/* ======================================================================== */
/* Helpers                                                                  */
/* ======================================================================== */

/* Records one violation with its khub_check_code (KHUB_CHECK_GATE_*). */
static void add_finding(khub_gate_report *rep, khub_check_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void add_finding(khub_gate_report *rep, khub_check_code code, const char *fmt, ...)
{
    if (rep->n_findings >= KHUB_GATE_MAX_FINDINGS) return;
    va_list ap;
    va_start(ap, fmt);
    rep->codes[rep->n_findings] = code;
    vsnprintf(rep->findings[rep->n_findings++], sizeof rep->findings[0], fmt, ap);
    va_end(ap);
}

/* Parses "GLIBC_a.b.c" into up to three numbers; missing parts are 0. */
static int parse_glibc(const char *s, long v[3])
{
    v[0] = v[1] = v[2] = 0;
    if (strncmp(s, "GLIBC_", 6) != 0) return 0;
    const char *p = s + 6;
    for (int i = 0; i < 3; i++) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno) return i > 0;
        v[i] = x;
        if (*end != '.') return 1;
        p = end + 1;
    }
    return 1;
}

int khub__glibc_version_cmp(const char *a, const char *b)
{
    long va[3], vb[3];
    parse_glibc(a, va);
    parse_glibc(b, vb);
    for (int i = 0; i < 3; i++)
        if (va[i] != vb[i]) return va[i] < vb[i] ? -1 : 1;
    return 0;
}

static int lib_allowed(const khub_gate_policy *pol, const char *name)
{
    const char *const *libs =
        pol && pol->allowed_libs ? pol->allowed_libs : khub__gate_default_libs;
    size_t n = pol && pol->allowed_libs ? pol->n_allowed_libs : khub__gate_n_default_libs;
    for (size_t i = 0; i < n; i++)
        if (strcmp(libs[i], name) == 0) return 1;
    return 0;
}

static khub_status read_whole(const char *path, unsigned char **out, size_t *n, char *errbuf,
                              size_t errbuf_size)
{
    int fd = khub__open_regular(path, errbuf, errbuf_size); /* never hangs on a FIFO */
    if (fd < 0) return KHUB_STATUS_IO;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size > MAX_PLUGIN_BYTES) {
        khub__errbuf(errbuf, errbuf_size, "%s: not a regular file of at most 1 GiB", path);
        close(fd);
        return KHUB_STATUS_IO;
    }
    size_t size = (size_t)sb.st_size;
    unsigned char *buf = malloc(size ? size : 1);
    size_t got = 0;
    while (buf && got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (!buf || got != size) {
        free(buf);
        khub__errbuf(errbuf, errbuf_size, "%s: read failed", path);
        return buf ? KHUB_STATUS_IO : KHUB_STATUS_NOMEM;
    }
    *out = buf;
    *n = size;
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* The checks, one section type each                                        */
/* ======================================================================== */

static void check_dynamic(Elf *e, Elf_Scn *scn, const GElf_Shdr *sh, const khub_gate_policy *pol,
                          khub_gate_report *rep)
{
    Elf_Data *d = elf_getdata(scn, NULL);
    if (!d || sh->sh_entsize == 0) return;
    size_t n = sh->sh_size / sh->sh_entsize;
    for (size_t i = 0; i < n; i++) {
        GElf_Dyn dyn;
        if (!gelf_getdyn(d, (int)i, &dyn)) break;
        const char *s = NULL;
        switch (dyn.d_tag) {
        case DT_NEEDED:
            s = elf_strptr(e, sh->sh_link, dyn.d_un.d_val);
            if (!s)
                add_finding(rep, KHUB_CHECK_GATE_LIBRARY,
                            "DT_NEEDED entry %zu has an invalid name offset", i);
            else if (!lib_allowed(pol, s))
                add_finding(rep, KHUB_CHECK_GATE_LIBRARY,
                            "needs library %s, which is not on the allow-list", s);
            break;
        case DT_RPATH:
        case DT_RUNPATH:
            s = elf_strptr(e, sh->sh_link, dyn.d_un.d_val);
            add_finding(rep, KHUB_CHECK_GATE_SEARCH_PATH,
                        "has %s '%s' (plugins must not carry search paths)",
                        dyn.d_tag == DT_RPATH ? "RPATH" : "RUNPATH", s ? s : "?");
            break;
        case DT_FLAGS_1:
            if (dyn.d_un.d_val & DF_1_NODELETE)
                add_finding(rep, KHUB_CHECK_GATE_NODELETE,
                            "is marked NODELETE (-z nodelete): it could never be unloaded");
            break;
        default: break;
        }
    }
}

/* The .gnu.version data (one index per .dynsym entry), or NULL. */
static Elf_Data *find_versym(Elf *e)
{
    for (Elf_Scn *scn = elf_nextscn(e, NULL); scn; scn = elf_nextscn(e, scn)) {
        GElf_Shdr sh;
        if (gelf_getshdr(scn, &sh) && sh.sh_type == SHT_GNU_versym) return elf_getdata(scn, NULL);
    }
    return NULL;
}

/* An undefined global symbol must carry a version from a needed library
 * (every library on the allow-list versions its symbols, so DT_NEEDED and
 * the allow-list decide where it comes from); an unversioned one would bind
 * to whatever the process has, e.g. the host's own khub_* functions, which
 * plugins reach only through khub_host_api. Weak ones (__gmon_start__) may
 * stay unresolved. A sanitizer build's own plugins import the sanitizer
 * runtimes' symbols and their interceptors of libc (memcpy, strncpy...)
 * unversioned, so such a build does not apply this rule. */
static void check_import(const char *name, const GElf_Sym *sym, Elf_Data *versym, size_t i,
                         khub_gate_report *rep)
{
#ifdef KHUB_SANITIZER_BUILD
    (void)name, (void)sym, (void)versym, (void)i, (void)rep;
    return;
#endif
    if (GELF_ST_BIND(sym->st_info) != STB_GLOBAL) return;
    GElf_Versym vs = 0;
    if (versym && gelf_getversym(versym, (int)i, &vs) && (vs & 0x7fff) >= 2) return;
    add_finding(rep, KHUB_CHECK_GATE_UNVERSIONED,
                "imports %s without a symbol version: it comes from no allowed library (the "
                "host is reached only through khub_host_api)",
                name);
}

static void check_symbols(Elf *e, Elf_Scn *scn, const GElf_Shdr *sh, khub_gate_report *rep,
                          int dynamic)
{
    Elf_Data *d = elf_getdata(scn, NULL);
    if (!d || sh->sh_entsize == 0) return;
    Elf_Data *versym = dynamic ? find_versym(e) : NULL;
    size_t n = sh->sh_size / sh->sh_entsize;
    for (size_t i = 1; i < n; i++) {
        GElf_Sym sym;
        if (!gelf_getsym(d, (int)i, &sym)) break;
        const char *name = elf_strptr(e, sh->sh_link, sym.st_name);
        if (!name) name = "?";
        int bind = GELF_ST_BIND(sym.st_info);
        if (bind == STB_GNU_UNIQUE) {
            add_finding(rep, KHUB_CHECK_GATE_GNU_UNIQUE,
                        "symbol %s is STB_GNU_UNIQUE: it pins the library in memory", name);
            continue;
        }
        if (dynamic && sym.st_shndx == SHN_UNDEF && name[0])
            check_import(name, &sym, versym, i, rep);
        if (!dynamic || sym.st_shndx == SHN_UNDEF) continue;
        if (bind != STB_GLOBAL && bind != STB_WEAK) continue;
        int vis = GELF_ST_VISIBILITY(sym.st_other);
        if (vis != STV_DEFAULT && vis != STV_PROTECTED) continue;
        if (strcmp(name, KHUB_PLUGIN_ENTRY) != 0)
            add_finding(rep, KHUB_CHECK_GATE_EXPORT, "exports %s (only %s may be exported)", name,
                        KHUB_PLUGIN_ENTRY);
        else if (GELF_ST_TYPE(sym.st_info) == STT_FUNC)
            rep->has_entry = 1;
    }
}

static void check_verneed(Elf *e, Elf_Scn *scn, const GElf_Shdr *sh, const khub_gate_policy *pol,
                          khub_gate_report *rep)
{
    const char *ceiling = pol && pol->glibc_ceiling ? pol->glibc_ceiling : "GLIBC_2.28";
    Elf_Data *d = elf_getdata(scn, NULL);
    if (!d) return;
    size_t off = 0;
    for (unsigned guard = 0; guard < 1024; guard++) {
        GElf_Verneed vn;
        if (!gelf_getverneed(d, (int)off, &vn)) break;
        size_t aoff = off + vn.vn_aux;
        for (unsigned j = 0; j < vn.vn_cnt && j < 1024; j++) {
            GElf_Vernaux va;
            if (!gelf_getvernaux(d, (int)aoff, &va)) break;
            const char *v = elf_strptr(e, sh->sh_link, va.vna_name);
            if (v && strncmp(v, "GLIBC_", 6) == 0 && strcmp(v, "GLIBC_PRIVATE") != 0) {
                if (!rep->max_glibc[0] || khub__glibc_version_cmp(v, rep->max_glibc) > 0)
                    snprintf(rep->max_glibc, sizeof rep->max_glibc, "%s", v);
            } else if (v && strcmp(v, "GLIBC_PRIVATE") == 0) {
                add_finding(rep, KHUB_CHECK_GATE_GLIBC, "uses GLIBC_PRIVATE symbols");
            }
            if (!va.vna_next) break;
            aoff += va.vna_next;
        }
        if (!vn.vn_next) break;
        off += vn.vn_next;
    }
    if (rep->max_glibc[0] && khub__glibc_version_cmp(rep->max_glibc, ceiling) > 0)
        add_finding(rep, KHUB_CHECK_GATE_GLIBC, "needs %s, newer than the ceiling %s",
                    rep->max_glibc, ceiling);
}

static void check_note(Elf *e, Elf_Scn *scn, const GElf_Shdr *sh, khub_gate_report *rep)
{
    Elf_Data *d = elf_getdata(scn, NULL);
    if (!d) return;
    size_t off = 0, name_off, desc_off;
    GElf_Nhdr nh;
    while ((off = gelf_getnote(d, off, &nh, &name_off, &desc_off)) > 0) {
        if (nh.n_type != KHUB_NOTE_TYPE || nh.n_namesz != sizeof(KHUB_NOTE_NAME) ||
            memcmp((const char *)d->d_buf + name_off, KHUB_NOTE_NAME, nh.n_namesz) != 0)
            continue;
        if (!khub__note_decode((const char *)d->d_buf + desc_off, nh.n_descsz, &rep->note)) {
            add_finding(rep, KHUB_CHECK_GATE_NOTE,
                        "ABI note is %u bytes, want %zu (version 1) or %zu (version 2)",
                        (unsigned)nh.n_descsz, sizeof(khub_abi_note), sizeof(khub_abi_note_v2));
            return;
        }
        rep->has_note = 1;
        return;
    }
    (void)e, (void)sh;
}

/* ======================================================================== */
/* Entry                                                                    */
/* ======================================================================== */

static khub_status check_elf(Elf *e, const char *path, const khub_gate_policy *pol,
                             khub_gate_report *rep, char *errbuf, size_t errbuf_size)
{
    GElf_Ehdr eh;
    if (elf_kind(e) != ELF_K_ELF || !gelf_getehdr(e, &eh)) {
        khub__errbuf(errbuf, errbuf_size, "%s: not an ELF file", path);
        return KHUB_STATUS_NOT_ELF;
    }
    if (gelf_getclass(e) != ELFCLASS64 || eh.e_type != ET_DYN) {
        khub__errbuf(errbuf, errbuf_size, "%s: not a 64-bit ELF shared object", path);
        return KHUB_STATUS_NOT_ELF;
    }
#if defined(__x86_64__)
    const unsigned host_machine = EM_X86_64;
#elif defined(__aarch64__)
    const unsigned host_machine = EM_AARCH64;
#else
    const unsigned host_machine = eh.e_machine;
#endif
    if (eh.e_machine != host_machine) {
        khub__errbuf(errbuf, errbuf_size, "%s: built for ELF machine %u, this host is %u", path,
                     (unsigned)eh.e_machine, host_machine);
        return KHUB_STATUS_WRONG_ARCH;
    }
    size_t shstrndx;
    if (elf_getshdrstrndx(e, &shstrndx) != 0) {
        khub__errbuf(errbuf, errbuf_size, "%s: no section header string table (truncated?)", path);
        return KHUB_STATUS_TRUNCATED;
    }
    for (Elf_Scn *scn = elf_nextscn(e, NULL); scn; scn = elf_nextscn(e, scn)) {
        GElf_Shdr sh;
        if (!gelf_getshdr(scn, &sh)) continue;
        const char *sname = elf_strptr(e, shstrndx, sh.sh_name);
        switch (sh.sh_type) {
        case SHT_DYNAMIC: check_dynamic(e, scn, &sh, pol, rep); break;
        case SHT_DYNSYM: check_symbols(e, scn, &sh, rep, 1); break;
        case SHT_SYMTAB: check_symbols(e, scn, &sh, rep, 0); break;
        case SHT_GNU_verneed: check_verneed(e, scn, &sh, pol, rep); break;
        case SHT_NOTE:
            if (sname && strcmp(sname, ".note.khub") == 0) check_note(e, scn, &sh, rep);
            break;
        default: break;
        }
    }
    if (!rep->has_note)
        add_finding(rep, KHUB_CHECK_GATE_NOTE,
                    "has no .note.khub ABI note (use KHUB_PLUGIN_DEFINE)");
    if (!rep->has_entry)
        add_finding(rep, KHUB_CHECK_GATE_ENTRY,
                    "has no entry symbol %s (build it with KHUB_PLUGIN_DEFINE as a module)",
                    KHUB_PLUGIN_ENTRY);
    return rep->n_findings ? KHUB_STATUS_PLUGIN_INVALID : KHUB_STATUS_OK;
}

khub_status khub__gate_check_mem(const void *data, size_t n, const char *label,
                                 const khub_gate_policy *policy, khub_gate_report *rep,
                                 char *errbuf, size_t errbuf_size)
{
    memset(rep, 0, sizeof *rep);
    if (n < 4 || memcmp(data, ELFMAG, SELFMAG) != 0) {
        khub__errbuf(errbuf, errbuf_size, "%s: not an ELF file (bad magic)", label);
        return KHUB_STATUS_NOT_ELF;
    }
    elf_version(EV_CURRENT);
    /* libelf reads through a char *; with elf_memory it does not write. */
    Elf *e = elf_memory((char *)(uintptr_t)data, n);
    if (!e) {
        khub__errbuf(errbuf, errbuf_size, "%s: libelf: %s", label, elf_errmsg(-1));
        return KHUB_STATUS_NOT_ELF;
    }
    khub_status st = check_elf(e, label, policy, rep, errbuf, errbuf_size);
    if (st == KHUB_STATUS_PLUGIN_INVALID)
        khub__errbuf(errbuf, errbuf_size, "%s: %zu ABI gate finding(s); first: %s", label,
                     rep->n_findings, rep->findings[0]);
    elf_end(e);
    return st;
}

khub_status khub__gate_check_file_sha(const char *path, const khub_gate_policy *policy,
                                      khub_gate_report *rep, char sha256_out[65], char *errbuf,
                                      size_t errbuf_size)
{
    memset(rep, 0, sizeof *rep);
    unsigned char *buf = NULL;
    size_t n = 0;
    khub_status st = read_whole(path, &buf, &n, errbuf, errbuf_size);
    if (st != KHUB_STATUS_OK) return st;
    if (sha256_out) st = khub__sha256_hex(buf, n, sha256_out);
    if (st == KHUB_STATUS_OK)
        st = khub__gate_check_mem(buf, n, path, policy, rep, errbuf, errbuf_size);
    free(buf);
    return st;
}

khub_status khub__gate_check_file(const char *path, const khub_gate_policy *policy,
                                  khub_gate_report *rep, char *errbuf, size_t errbuf_size)
{
    return khub__gate_check_file_sha(path, policy, rep, NULL, errbuf, errbuf_size);
}

void khub__gate_load_policy(khub_gate_policy *pol, char ceiling_buf[32])
{
    snprintf(ceiling_buf, 32, "GLIBC_%s", gnu_get_libc_version());
    *pol = (khub_gate_policy){.glibc_ceiling = ceiling_buf};
}

/* ======================================================================== */
/* PTX                                                                      */
/* ======================================================================== */

/* Finds directive `word` at the start of a line (after blanks) in text. */
static const char *find_directive(const char *text, size_t len, const char *word)
{
    size_t wl = strlen(word);
    for (size_t i = 0; i + wl < len; i++) {
        if ((i == 0 || text[i - 1] == '\n')) {
            size_t j = i;
            while (j < len && (text[j] == ' ' || text[j] == '\t')) j++;
            if (j + wl < len && memcmp(text + j, word, wl) == 0 &&
                (text[j + wl] == ' ' || text[j + wl] == '\t'))
                return text + j + wl;
        }
    }
    return NULL;
}

khub_status khub__ptx_inspect(const char *text, size_t len, int *isa, int *sm, char *suffix)
{
    const char *v = find_directive(text, len, ".version");
    const char *t = find_directive(text, len, ".target");
    if (!v || !t) return KHUB_STATUS_PARSE;
    const char *end = text + len;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    int maj = 0, min = 0, digits = 0;
    while (v < end && *v >= '0' && *v <= '9' && digits < 3) maj = maj * 10 + (*v++ - '0'), digits++;
    if (!digits || v >= end || *v != '.') return KHUB_STATUS_PARSE;
    v++;
    digits = 0;
    while (v < end && *v >= '0' && *v <= '9' && digits < 2) min = min * 10 + (*v++ - '0'), digits++;
    if (!digits) return KHUB_STATUS_PARSE;
    while (t < end && (*t == ' ' || *t == '\t')) t++;
    if (end - t < 4 || memcmp(t, "sm_", 3) != 0) return KHUB_STATUS_PARSE;
    t += 3;
    int arch = 0;
    digits = 0;
    while (t < end && *t >= '0' && *t <= '9' && digits < 4)
        arch = arch * 10 + (*t++ - '0'), digits++;
    if (!digits) return KHUB_STATUS_PARSE;
    *suffix = (t < end && (*t == 'a' || *t == 'f')) ? *t : '\0';
    *isa = maj * 10 + min;
    *sm = arch;
    return KHUB_STATUS_OK;
}

/* A cubin is an ELF64 with EI_OSABI 0x41 (CUDA) and e_machine EM_CUDA (190);
 * its SM is in e_flags: bits 0-7 up to ELF ABI version 7 (EF_CUDA_SM), bits
 * 8-15 from version 8, which is what NVRTC 13.0 writes (sm_90 cubins have
 * e_flags 0x06005a04). */
khub_status khub__cubin_inspect(const unsigned char *data, size_t len, int *sm)
{
    if (len < 64 || memcmp(data, "\177ELF", 4) != 0 || data[EI_CLASS] != ELFCLASS64 ||
        data[EI_DATA] != ELFDATA2LSB)
        return KHUB_STATUS_NOT_ELF;
    unsigned machine = (unsigned)data[18] | (unsigned)data[19] << 8;
    uint32_t flags = (uint32_t)data[48] | (uint32_t)data[49] << 8 | (uint32_t)data[50] << 16 |
                     (uint32_t)data[51] << 24;
    if (data[EI_OSABI] != 0x41 || machine != 190) return KHUB_STATUS_WRONG_ARCH;
    *sm = (int)(data[EI_ABIVERSION] >= 8 ? (flags >> 8) & 0xff : flags & 0xff);
    return *sm > 0 ? KHUB_STATUS_OK : KHUB_STATUS_PARSE;
}
