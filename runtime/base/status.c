/* status.c: names and descriptions of khub_status, generated from the one
 * X-macro list in khub_status.h. */
#include "internal.h"

const char *khub_status_name(khub_status st)
{
    switch (st) {
#define KHUB__STATUS_NAME(name, value, text) \
    case KHUB_STATUS_##name: return "KHUB_STATUS_" #name;
        KHUB_STATUS_MAP(KHUB__STATUS_NAME)
#undef KHUB__STATUS_NAME
    default: return "KHUB_STATUS_UNKNOWN";
    }
}

const char *khub_status_str(khub_status st)
{
    switch (st) {
#define KHUB__STATUS_STR(name, value, text) \
    case KHUB_STATUS_##name: return text;
        KHUB_STATUS_MAP(KHUB__STATUS_STR)
#undef KHUB__STATUS_STR
    default: return "unknown status";
    }
}

unsigned khub_version_num(void) { return KHUB_VERSION_NUM; }

const char *khub_version_str(void) { return KHUB_VERSION_STRING; }
