/* fuzz_elf.c: libFuzzer target for what reads a plugin's bytes before
 * dlopen runs any of them (runtime/loader/): the ELF inspection of the ABI
 * note (khub__elf_inspect, every load) and the ABI gate (khub__gate_check_mem,
 * every downloaded plugin, and `khub check`), under the load policy (this
 * glibc's ceiling) and the publish policy; and the CUDA artifact readers
 * `khub check` runs (khub__cubin_inspect, khub__ptx_inspect).
 *
 * The image lies in a read-only mapping that ends at a PROT_NONE guard page,
 * as the loader's sealed bytes are read only: a write by libelf, or a read
 * past the end by code ASan does not instrument (libelf), faults. Seeds are
 * the built plugins (tests/fuzz/run.sh). Any input may be refused; none may
 * crash, leak, or read out of bounds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "elf_gate.h"
#include "runtime_impl.h"

/* size bytes of data copied to the end of a read-only mapping followed by a
 * guard page; map and map_len to unmap. NULL when it cannot be mapped. */
static const unsigned char *guarded_copy(const uint8_t *data, size_t size, void **map,
                                         size_t *map_len)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t body = (size + page - 1) / page * page;
    if (body == 0) body = page;
    unsigned char *m =
        mmap(NULL, body + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    unsigned char *img = m + body - size;
    if (size) memcpy(img, data, size);
    if (mprotect(m, body, PROT_READ) != 0 || mprotect(m + body, page, PROT_NONE) != 0) abort();
    *map = m;
    *map_len = body + page;
    return img;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact-size heap copy for ASan, as the loader reads the file into. */
    unsigned char *heap = malloc(size ? size : 1);
    if (!heap) return 0;
    if (size) memcpy(heap, data, size);
    char msg[KHUB_ERROR_SIZE];
    khub_plugin_info info = {KHUB_STRUCT_INIT(khub_plugin_info)};
    (void)khub__elf_inspect(heap, size, "fuzz.so", &info, msg, sizeof msg);

    static khub_gate_report rep; /* 9 KB: not on the stack */
    khub_gate_policy load;
    char ceiling[32];
    khub__gate_load_policy(&load, ceiling);
    (void)khub__gate_check_mem(heap, size, "fuzz.so", &load, &rep, msg, sizeof msg);

    int sm = 0, isa = 0;
    char suffix = 0;
    (void)khub__cubin_inspect(heap, size, &sm);
    (void)khub__ptx_inspect((const char *)heap, size, &isa, &sm, &suffix);
    free(heap);

    void *map = NULL;
    size_t map_len = 0;
    const unsigned char *ro = guarded_copy(data, size, &map, &map_len);
    if (!ro) return 0;
    (void)khub__elf_inspect(ro, size, "fuzz.so", &info, msg, sizeof msg);
    (void)khub__gate_check_mem(ro, size, "fuzz.so", NULL, &rep, msg, sizeof msg);
    munmap(map, map_len);
    return 0;
}
