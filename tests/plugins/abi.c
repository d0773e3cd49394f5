/*
 * abi.c: test plugins whose ABI note the host must reject before running
 * anything. The header's version macros are redefined after the include, so
 * KHUB_PLUGIN_DEFINE stamps the note (and the descriptor) with them:
 *   ABI_MINOR_NEWER  note says 1.9 (newer than the host)
 *   ABI_MAJOR_OTHER  note says 2.0
 * A pointer-size mismatch needs a hand-made note (handmade.c).
 * Each also has a constructor that raises SIGSEGV: the loader must reject
 * them from the note alone, never dlopen them, so the tests that load them
 * in-process survive only if no plugin code ran.
 */
#include <signal.h>

#include <khub/khub_plugin.h>

__attribute__((constructor)) static void crash_if_ever_mapped(void) { raise(SIGSEGV); }

#if defined(ABI_MINOR_NEWER)
#undef KHUB_ABI_MINOR
#define KHUB_ABI_MINOR 9
#define TP_ID          "khub-test/minor-newer"
#elif defined(ABI_MAJOR_OTHER)
#undef KHUB_ABI_MAJOR
#define KHUB_ABI_MAJOR 2
#undef KHUB_ABI_MINOR
#define KHUB_ABI_MINOR 1
#define TP_ID          "khub-test/major-other"
#endif

static khub_status init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                        size_t errbuf_size)
{
    (void)host, (void)errbuf, (void)errbuf_size;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc), .id = TP_ID, .version = "1.2.0"};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE(init, TP_ID, "1.2.0")
