/*
 * init_templates.h: source templates for `khub init` (init_templates.c).
 */
#ifndef KHUB_CLI_INIT_TEMPLATES_H
#define KHUB_CLI_INIT_TEMPLATES_H

#include <stddef.h>
#include <string.h>

typedef struct khub_init_template {
    const char *kind;      /* kernel.json's kind: "attention", "norm", "qlinear", ... */
    const char *op;        /* the op's name in kernel.json and the plugin */
    const char *cpu_src;   /* the op; the shared entry is appended */
    const char *cuda_src;  /* the .cu kernel, or NULL when no CUDA template */
    const char *cuda_glue; /* the launch glue; head and entry are added around it */
    const char *selftests; /* JSON array for kernel.json */
} khub_init_template;

const khub_init_template *khub_init_template_find(const char *kind);
/* The kinds with a template, "attention, norm, ..." in buf; with_cuda: only
 * those with a CUDA template. */
void khub_init_kinds(char *buf, size_t n, int with_cuda);
const char *khub_init_cpu_entry(void);
const char *khub_init_cuda_head(void);
const char *khub_init_cuda_entry(void);

#endif /* KHUB_CLI_INIT_TEMPLATES_H */
