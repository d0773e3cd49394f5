/* loader.c: placeholder until the verifying loader lands (issue 2). */
#include "runtime_impl.h"

void khub__registry_teardown(khub_runtime *rt) { (void)rt; }
