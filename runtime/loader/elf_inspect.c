/*
 * elf_inspect.c: reading a plugin's ELF header and ABI note from memory,
 * before any of its code runs, and the numeric ABI rule.
 *
 * The image is hostile. The fixed-size ELF header and the section and
 * program header tables are checked by hand against the image size first
 * (so a truncated file is TRUNCATED, never a read past the end); only then
 * does libelf walk the sections, and each note is bounds-checked again
 * against its section's data.
 */
#include <elf.h>
#include <gelf.h>
#include <libelf.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "elf_gate.h"
#include "runtime_impl.h"

#if defined(__x86_64__)
#define HOST_EM EM_X86_64
#elif defined(__aarch64__)
#define HOST_EM EM_AARCH64
#else
#error "khub: add this architecture's EM_* value"
#endif

/* ======================================================================== */
/* The ABI rule                                                             */
/* ======================================================================== */

khub_status khub__abi_check_range(unsigned major, unsigned minor, unsigned ptr_size,
                                  unsigned host_major, unsigned min_minor, unsigned host_minor,
                                  unsigned host_ptr, char *msg, size_t n)
{
    khub_status st = KHUB_STATUS_OK;
    if (major != host_major)
        st = KHUB_STATUS_ABI_MAJOR;
    else if (minor > host_minor || minor < min_minor)
        st = KHUB_STATUS_ABI_MINOR;
    else if (ptr_size != host_ptr)
        st = KHUB_STATUS_PTR_SIZE;
    if (st == KHUB_STATUS_PTR_SIZE)
        khub__errbuf(msg, n, "pointer size %u bytes, host pointer size %u bytes", ptr_size,
                     host_ptr);
    else if (st != KHUB_STATUS_OK)
        khub__errbuf(msg, n, "ABI %u.%u, host supports %u.%u-%u.%u", major, minor, host_major,
                     min_minor, host_major, host_minor);
    return st;
}

khub_status khub__abi_check(unsigned major, unsigned minor, unsigned ptr_size, char *msg, size_t n)
{
    return khub__abi_check_range(major, minor, ptr_size, KHUB_ABI_MAJOR, KHUB_ABI_MINOR_MIN,
                                 KHUB_ABI_MINOR, (unsigned)sizeof(void *), msg, n);
}

/* ======================================================================== */
/* Raw header checks                                                        */
/* ======================================================================== */

static const char *machine_name(unsigned em)
{
    switch (em) {
    case EM_386: return "i386";
    case EM_X86_64: return "x86_64";
    case EM_ARM: return "arm";
    case EM_AARCH64: return "aarch64";
    case EM_RISCV: return "riscv";
    case EM_PPC64: return "ppc64";
    case EM_S390: return "s390";
    default: return "an unknown machine";
    }
}

/* True when [off, off + count * entsize) lies within size. */
static bool table_fits(uint64_t off, uint64_t count, uint64_t entsize, size_t size)
{
    size_t bytes, end;
    if (off > SIZE_MAX || count > SIZE_MAX || entsize > SIZE_MAX) return false;
    if (!khub__mul_ok((size_t)count, (size_t)entsize, &bytes)) return false;
    if (!khub__add_ok((size_t)off, bytes, &end)) return false;
    return end <= size;
}

/* Magic, class, byte order, machine and type, read from the raw bytes. */
static khub_status check_ident(const unsigned char *b, size_t size, const char *label, char *msg,
                               size_t n)
{
    if (size < SELFMAG || memcmp(b, ELFMAG, SELFMAG) != 0) {
        /* Only the bytes the file has: a 2-byte file starts with 2 bytes. */
        char head[16] = "";
        for (size_t i = 0; i < size && i < SELFMAG; i++) {
            size_t len = strlen(head);
            snprintf(head + len, sizeof head - len, "%s%02x", i ? " " : "", b[i]);
        }
        khub__errbuf(msg, n,
                     "%s: not an ELF file (%s%s, want 7f 45 4c 46); "
                     "a plugin is a .so built with khub_add_plugin()",
                     label, size ? "starts with " : "empty", head);
        return KHUB_STATUS_NOT_ELF;
    }
    if (size < 20) {
        khub__errbuf(msg, n, "%s: truncated ELF header (%zu bytes); re-download the file", label,
                     size);
        return KHUB_STATUS_TRUNCATED;
    }
    bool lsb = b[EI_DATA] == ELFDATA2LSB;
    unsigned em = lsb ? (unsigned)(b[18] | b[19] << 8) : (unsigned)(b[18] << 8 | b[19]);
    if (b[EI_CLASS] != ELFCLASS64 || !lsb || em != HOST_EM) {
        khub__errbuf(msg, n,
                     "%s: built for %s (%s, %s-endian, e_machine %u), host is %s (64-bit, "
                     "little-endian, e_machine %u); fetch the variant for this machine",
                     label, machine_name(em), b[EI_CLASS] == ELFCLASS64 ? "64-bit" : "32-bit",
                     lsb ? "little" : "big", em, machine_name(HOST_EM), (unsigned)HOST_EM);
        return KHUB_STATUS_WRONG_ARCH;
    }
    if (size < sizeof(Elf64_Ehdr)) {
        khub__errbuf(msg, n, "%s: truncated ELF header (%zu of %zu bytes); re-download the file",
                     label, size, sizeof(Elf64_Ehdr));
        return KHUB_STATUS_TRUNCATED;
    }
    return KHUB_STATUS_OK;
}

/* Section and program header tables, and every section's bytes, in range. */
static khub_status check_tables(const unsigned char *b, size_t size, const char *label, char *msg,
                                size_t n)
{
    Elf64_Ehdr eh;
    memcpy(&eh, b, sizeof eh);
    if (eh.e_type != ET_DYN) {
        khub__errbuf(msg, n, "%s: ELF type %u is not a shared object (ET_DYN = %u)", label,
                     (unsigned)eh.e_type, (unsigned)ET_DYN);
        return KHUB_STATUS_NOT_ELF;
    }
    if (eh.e_shentsize != sizeof(Elf64_Shdr) ||
        (eh.e_phnum && eh.e_phentsize != sizeof(Elf64_Phdr)) || eh.e_shoff == 0) {
        khub__errbuf(msg, n, "%s: malformed ELF header (section entry %u bytes, offset %llu)",
                     label, (unsigned)eh.e_shentsize, (unsigned long long)eh.e_shoff);
        return KHUB_STATUS_NOT_ELF;
    }
    uint64_t shnum = eh.e_shnum;
    if (shnum == 0 && table_fits(eh.e_shoff, 1, sizeof(Elf64_Shdr), size)) {
        Elf64_Shdr s0; /* extended numbering: the count is in section 0 */
        memcpy(&s0, b + eh.e_shoff, sizeof s0);
        shnum = s0.sh_size;
    }
    if (!table_fits(eh.e_shoff, shnum ? shnum : 1, sizeof(Elf64_Shdr), size) ||
        !table_fits(eh.e_phoff, eh.e_phnum, sizeof(Elf64_Phdr), size)) {
        khub__errbuf(msg, n,
                     "%s: truncated: headers at offset %llu (%llu sections) lie past the end of "
                     "the file (%zu bytes); re-download it",
                     label, (unsigned long long)eh.e_shoff, (unsigned long long)shnum, size);
        return KHUB_STATUS_TRUNCATED;
    }
    for (uint64_t i = 0; i < shnum; i++) {
        Elf64_Shdr sh;
        memcpy(&sh, b + eh.e_shoff + i * sizeof sh, sizeof sh);
        if (sh.sh_type != SHT_NOBITS && !table_fits(sh.sh_offset, 1, sh.sh_size, size)) {
            khub__errbuf(msg, n,
                         "%s: truncated: section %llu ends at %llu, file has %zu bytes; "
                         "re-download it",
                         label, (unsigned long long)i,
                         (unsigned long long)(sh.sh_offset + sh.sh_size), size);
            return KHUB_STATUS_TRUNCATED;
        }
    }
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* The ABI note                                                             */
/* ======================================================================== */

static pthread_once_t elf_once = PTHREAD_ONCE_INIT;
static void elf_init(void) { (void)elf_version(EV_CURRENT); }

/* Copies a string of a note of capacity cap into dst (of dst_cap bytes), or
 * leaves dst "" when it is not NUL-terminated within cap. */
static void note_str(char *dst, size_t dst_cap, const char *src, size_t cap)
{
    memset(dst, 0, dst_cap);
    if (memchr(src, '\0', cap) && cap <= dst_cap) memcpy(dst, src, cap);
}

bool khub__note_decode(const void *desc, size_t size, khub_abi_note_v2 *out)
{
    memset(out, 0, sizeof *out);
    if (size < offsetof(khub_abi_note, id)) return false;
    memcpy(out, desc, offsetof(khub_abi_note, id)); /* version, ABI, ptr_size, kinds */
    if (out->note_version == 1 && size >= sizeof(khub_abi_note)) {
        khub_abi_note v1;
        memcpy(&v1, desc, sizeof v1);
        note_str(out->id, sizeof out->id, v1.id, sizeof v1.id);
        note_str(out->version, sizeof out->version, v1.version, sizeof v1.version);
    } else if (out->note_version == 2 && size >= sizeof(khub_abi_note_v2)) {
        khub_abi_note_v2 v2;
        memcpy(&v2, desc, sizeof v2);
        note_str(out->id, sizeof out->id, v2.id, sizeof v2.id);
        note_str(out->version, sizeof out->version, v2.version, sizeof v2.version);
    } else if (out->note_version == 1 || out->note_version == 2) {
        return false; /* shorter than its version's layout */
    }
    return true;
}

/* Looks for the khub note in one SHT_NOTE section's data. */
static bool find_note(Elf_Data *d, khub_abi_note_v2 *out)
{
    size_t off = 0, name_off, desc_off;
    GElf_Nhdr nh;
    while (off < d->d_size && (off = gelf_getnote(d, off, &nh, &name_off, &desc_off)) > 0) {
        size_t name_end, desc_end;
        if (!khub__add_ok(name_off, nh.n_namesz, &name_end) || name_end > d->d_size ||
            !khub__add_ok(desc_off, nh.n_descsz, &desc_end) || desc_end > d->d_size)
            return false;
        const char *name = (const char *)d->d_buf + name_off;
        if (nh.n_type == KHUB_NOTE_TYPE && nh.n_namesz == sizeof(KHUB_NOTE_NAME) &&
            memcmp(name, KHUB_NOTE_NAME, sizeof(KHUB_NOTE_NAME)) == 0 &&
            khub__note_decode((const char *)d->d_buf + desc_off, nh.n_descsz, out))
            return true;
    }
    return false;
}

/* 0 = no .note.khub section, 1 = section without a khub note, 2 = found. */
static int read_note(Elf *e, khub_abi_note_v2 *note)
{
    size_t shstrndx;
    if (elf_getshdrstrndx(e, &shstrndx) != 0) return 0;
    int result = 0;
    for (Elf_Scn *scn = elf_nextscn(e, NULL); scn; scn = elf_nextscn(e, scn)) {
        GElf_Shdr sh;
        if (!gelf_getshdr(scn, &sh) || sh.sh_type != SHT_NOTE) continue;
        const char *name = elf_strptr(e, shstrndx, sh.sh_name);
        if (!name || strcmp(name, ".note.khub") != 0) continue;
        result = 1;
        for (Elf_Data *d = elf_getdata(scn, NULL); d; d = elf_getdata(scn, d))
            if (d->d_buf && find_note(d, note)) return 2;
    }
    return result;
}

/* ======================================================================== */
/* Plugin names                                                             */
/* ======================================================================== */

/* A plugin's id and version reach terminals, logs and JSON; a byte such as
 * ESC would be printed raw (terminal escape codes), so both are held to the
 * characters of a Hub ID: an id to letters, digits, '-', '_', '.' and '/'
 * ("kernels-community/flash-attn2"), a version to those without '/' plus '+'
 * (semver build metadata, "1.2.0+cu130"). */
static bool name_char_ok(unsigned char c, bool version)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
    if (c == '-' || c == '_' || c == '.') return true;
    return version ? c == '+' : c == '/';
}

khub_status khub__plugin_name_check(const char *id, const char *version, char *msg, size_t n)
{
    const char *s[2] = {id, version};
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; s[k][i]; i++) {
            if (name_char_ok((unsigned char)s[k][i], k == 1)) continue;
            char shown[4 * 96 + 1];
            size_t len = 0;
            for (size_t j = 0; s[k][j] && j < 96; j++) { /* escaped, never raw */
                unsigned char c = (unsigned char)s[k][j];
                len += (size_t)snprintf(shown + len, sizeof shown - len,
                                        c >= 0x20 && c < 0x7f && c != '\\' ? "%c" : "\\x%02x", c);
            }
            khub__errbuf(msg, n,
                         "plugin %s \"%s\" has byte 0x%02x at offset %zu; a plugin %s may hold "
                         "only letters, digits, '-', '_', '.' and %s",
                         k ? "version" : "id", shown, (unsigned char)s[k][i], i,
                         k ? "version" : "id", k ? "'+'" : "'/' (Hub ID characters)");
            return KHUB_STATUS_PLUGIN_INVALID;
        }
    }
    return KHUB_STATUS_OK;
}

static khub_status check_note(const khub_abi_note_v2 *note, const char *label, char *msg, size_t n)
{
    if (note->note_version != 1 && note->note_version != 2) {
        khub__errbuf(msg, n, "%s: ABI note version %u, host reads versions 1 and 2; update khub",
                     label, (unsigned)note->note_version);
        return KHUB_STATUS_NO_ABI_NOTE;
    }
    if (note->id[0] == '\0' || note->version[0] == '\0') { /* "" when unterminated */
        khub__errbuf(msg, n,
                     "%s: malformed ABI note: id or version empty or unterminated; "
                     "rebuild the plugin with KHUB_PLUGIN_DEFINE",
                     label);
        return KHUB_STATUS_NO_ABI_NOTE;
    }
    khub_status st = khub__plugin_name_check(note->id, note->version, msg, n);
    if (st != KHUB_STATUS_OK) {
        size_t len = strlen(msg); /* "(label)" after the rule, as the other checks name it */
        if (len < n) snprintf(msg + len, n - len, " (%s)", label);
        return st;
    }
    char why[160];
    st = khub__abi_check(note->abi_major, note->abi_minor, note->ptr_size, why, sizeof why);
    if (st != KHUB_STATUS_OK)
        khub__errbuf(msg, n, "plugin %s %s: %s (%s)", note->id, note->version, why, label);
    return st;
}

khub_status khub__elf_inspect(const void *data, size_t size, const char *label,
                              khub_plugin_info *info, char *msg, size_t n)
{
    const unsigned char *b = data;
    khub_status st = check_ident(b, size, label, msg, n);
    if (st == KHUB_STATUS_OK) st = check_tables(b, size, label, msg, n);
    if (st != KHUB_STATUS_OK) return st;

    pthread_once(&elf_once, elf_init);
    /* libelf reads through a char *; it does not write to a read-only image
     * (ELF_C_READ_MMAP_PRIVATE semantics), and the tables are checked above. */
    Elf *e = elf_memory((char *)(uintptr_t)b, size);
    if (!e) {
        khub__errbuf(msg, n, "%s: libelf cannot read it: %s", label, elf_errmsg(-1));
        return KHUB_STATUS_NOT_ELF;
    }
    khub_abi_note_v2 note;
    int found = read_note(e, &note);
    elf_end(e);
    if (found != 2) {
        khub__errbuf(msg, n,
                     found ? "%s: .note.khub holds no note of owner \"khub\" type 0x%x; rebuild "
                             "the plugin with KHUB_PLUGIN_DEFINE"
                           : "%s: no .note.khub section (type 0x%x): not a khub plugin, or built "
                             "without KHUB_PLUGIN_DEFINE",
                     label, KHUB_NOTE_TYPE);
        return KHUB_STATUS_NO_ABI_NOTE;
    }
    st = check_note(&note, label, msg, n);
    if (st != KHUB_STATUS_OK) return st;

    snprintf(info->id, sizeof info->id, "%s", note.id);
    memcpy(info->full_id, note.id, sizeof info->full_id);
    memcpy(info->version, note.version, sizeof info->version);
    info->plugin_abi_major = note.abi_major;
    info->plugin_abi_minor = note.abi_minor;
    info->kinds = note.kinds;
    info->ptr_size = note.ptr_size;
    info->elf_machine = HOST_EM;
    return KHUB_STATUS_OK;
}
