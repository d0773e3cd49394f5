/*
 * quarantine.h: kernel builds that crashed or exited during a call
 * (hub/quarantine.c). Internal: used by runtime/kernels/kernel_load.c, hub/cache_api.c (the
 * public khub_cache_quarantine_*) and tests.
 *
 * The marker is a one-line file at
 *     <cache>/<repo folder>/khub-quarantine/<commit>/<variant>
 * ("kernels--org--name/khub-quarantine/0123.../khub1-cpu-x86_64-linux"),
 * beside khub-variants/<commit>/<variant> and keyed the same way: the
 * same build is refused, a new commit of the repo is not. runtime/loader/contain.c
 * writes it from its signal and exit handlers (the path is handed to the
 * plugin at load); its text says what happened ("SIGSEGV in plugin ...").
 */
#ifndef KHUB_HUB_QUARANTINE_H
#define KHUB_HUB_QUARANTINE_H

#include "hub_impl.h"
#include "khub/khub_cache.h"

/* The marker path of commit's variant into buf; repo_dir is the cache's
 * folder of its repo (khub__variant.repo_dir: where the build that is
 * loaded was verified). OVERFLOW, BAD_ID. */
KHUB_INTERNAL khub_status khub__quarantine_path(khub_hub *hub, const char *repo_dir,
                                                const char *commit, const char *variant, char *buf,
                                                size_t size);

/* Before loading a cached build: when its marker exists, fails on rt with
 * QUARANTINED (naming the build, what happened and the ways out), unless
 * rt's KHUB_OPT_ALLOW_QUARANTINED is 1, which logs a warning instead.
 * path is the marker's path (khub__quarantine_path). */
KHUB_INTERNAL khub_status khub__quarantine_gate(khub_runtime *rt, const char *repo,
                                                const char *commit, const char *variant,
                                                const char *path);

/* One marker: repo "org/name", commit, variant, and its text (one line);
 * the public khub_cache_quarantine_fn. */
typedef khub_cache_quarantine_fn khub_quarantine_fn;

/* Calls fn for every marker in hub's cache, or only repo's ("org/name", or
 * NULL for all), in folder order. With clear each is removed after fn
 * hears of it (and the folders left empty). *count gets the number.
 * Statuses: IO (a marker that cannot be removed). */
KHUB_INTERNAL khub_status khub__quarantine_walk(khub_hub *hub, const char *repo, int clear,
                                                khub_quarantine_fn fn, void *ud, size_t *count);

#endif /* KHUB_HUB_QUARANTINE_H */
