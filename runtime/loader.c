/* loader.c: placeholder until the verifying loader lands (issue 2). */
#include "runtime_impl.h"

void khub__registry_teardown(khub_runtime *rt) { (void)rt; }

khub_status khub_plugin_load_builtin(khub_runtime *rt)
{
    return khub__fail(rt, KHUB_STATUS_UNSUPPORTED, "the plugin loader is not built yet");
}
