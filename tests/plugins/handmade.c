/*
 * handmade.c: test plugins with a hand-written ABI note or none:
 *   NOTE_PTR4  a note claiming 4-byte pointers (as a 32-bit build would)
 *   NO_ENTRY   a valid note but no khub_plugin_init_v1
 *   NO_NOTE    an entry but no .note.khub section (and a constructor that
 *              crashes if it is ever mapped)
 * Built without KHUB_PLUGIN_DEFINE, so nothing else is emitted.
 */
#include <khub/khub_plugin.h>

#if defined(NOTE_PTR4) || defined(NO_ENTRY)
#if defined(NOTE_PTR4)
#define TP_PTR 4u
#define TP_ID  "khub-test/ptr4"
#else
#define TP_PTR 8u
#define TP_ID  "khub-test/no-entry"
#endif
__attribute__((section(".note.khub"), used, aligned(4))) static const struct {
    uint32_t namesz, descsz, type;
    char name[8];
    khub_abi_note desc;
} note = {sizeof(KHUB_NOTE_NAME),
          sizeof(khub_abi_note),
          KHUB_NOTE_TYPE,
          KHUB_NOTE_NAME,
          {1, KHUB_ABI_MAJOR, KHUB_ABI_MINOR, TP_PTR, 0, TP_ID, "1.0.0"}};
#endif

#if defined(NOTE_PTR4) || defined(NO_NOTE)
KHUB_PLUGIN_EXPORT khub_status khub_plugin_init_v1(const khub_host_api *host, khub_plugin_desc *out,
                                                   char *errbuf, size_t errbuf_size)
{
    (void)host, (void)errbuf, (void)errbuf_size;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc), .id = "khub-test/handmade",
                          .version = "1.0.0"};
    return khub_plugin_desc_put(out, &d);
}
#endif

#if defined(NO_NOTE)
#include <signal.h>
/* Unknown to the host: it must be rejected from its missing note alone,
 * never dlopened, or this constructor crashes the test that loads it. */
__attribute__((constructor)) static void crash_if_ever_mapped(void) { raise(SIGSEGV); }
#endif

#if defined(NO_ENTRY)
/* Something exported, so the object is a plausible library. */
KHUB_PLUGIN_EXPORT int khub_test_not_the_entry(void) { return 1; }
#endif
