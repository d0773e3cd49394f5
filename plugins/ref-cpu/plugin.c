/* plugin.c: ref-cpu entry (placeholder: no ops yet). */
#include <khub/khub_plugin.h>

static khub_status ref_init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                            size_t errbuf_size)
{
    (void)host, (void)errbuf, (void)errbuf_size;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc), .id = "khub/ref-cpu",
                          .version = "0.1.0"};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE(ref_init, "khub/ref-cpu", "0.1.0")
