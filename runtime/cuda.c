/* cuda.c: placeholder until the dlopen'ed CUDA driver layer lands. */
#include "runtime_impl.h"

void khub__cuda_close(khub_runtime *rt) { (void)rt; }
