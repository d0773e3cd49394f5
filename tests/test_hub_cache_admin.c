/* test_hub_cache_admin.c: `khub cache ls|verify|prune` on a cache made by
 * khub's own downloads from an in-process `khub serve`: the scan's repos,
 * revisions and refs; verify catching a flipped byte (SHA-256 and git
 * SHA-1 blobs); prune removing detached snapshots and unreferenced blobs
 * but nothing outside the cache, nothing in flight, nothing with dry_run. */
#include <dirent.h>

#include "cache_admin.h"
#include "hub_fixture.h"

typedef struct seen {
    int n;
    char kinds[32][16];
    char paths[32][600];
} seen;

static void record(void *ud, const char *kind, const char *path, const char *detail)
{
    seen *s = ud;
    (void)detail;
    if (s->n < 32) {
        snprintf(s->kinds[s->n], sizeof s->kinds[0], "%s", kind);
        snprintf(s->paths[s->n], sizeof s->paths[0], "%s", path);
    }
    s->n++;
}

static int saw(const seen *s, const char *kind, const char *path_part)
{
    for (int i = 0; i < s->n && i < 32; i++)
        if (!strcmp(s->kinds[i], kind) && strstr(s->paths[i], path_part)) return 1;
    return 0;
}

/* Downloads README.md and weights.bin at main (C1) and README.md at v2 (C2). */
static khub_hub *fill_cache(fixture *fx)
{
    fx_init(fx, NULL, 0);
    khub_hub *hub = fx_hub(fx, 0, NULL);
    char commit[41], *p = NULL;
    khub_hub_id id = fx_id("org/demo@main");
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    ASSERT_OK(khub_hub_download_file(hub, &id, commit, "README.md", &p));
    free(p);
    ASSERT_OK(khub_hub_download_file(hub, &id, commit, "weights.bin", &p));
    free(p);
    id = fx_id("org/demo@version=2");
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    ASSERT_OK(khub_hub_download_file(hub, &id, commit, "README.md", &p));
    free(p);
    return hub;
}

static void blob_path(const fixture *fx, const char *commit, const char *rel, char *out, size_t n)
{
    char link[600], target[600];
    snprintf(link, sizeof link, "%s/kernels--org--demo/snapshots/%s/%s", fx->cache, commit, rel);
    ssize_t k = readlink(link, target, sizeof target - 1);
    ASSERT(k > 0);
    target[k] = '\0';
    snprintf(out, n, "%s/kernels--org--demo/blobs/%s", fx->cache, strrchr(target, '/') + 1);
}

TEST_IMPL(scan_lists_repos_and_revisions)
{
    fixture fx;
    khub_hub *hub = fill_cache(&fx);
    khub_cache_report *r = NULL;
    ASSERT_OK(khub__cache_scan(hub, &r));
    ASSERT_EQ(r->n_repos, 1);
    const khub_cache_repo *p = &r->repos[0];
    ASSERT_STR_EQ(p->folder, "kernels--org--demo");
    ASSERT_STR_EQ(p->type, "kernel");
    ASSERT_STR_EQ(p->id, "org/demo");
    ASSERT_EQ(p->n_blobs, 3);
    ASSERT_EQ(p->size, 70000 + strlen("# demo kernel\n") + strlen("# demo kernel v2\n"));
    ASSERT_EQ(p->n_revs, 2);
    ASSERT_STR_EQ(p->revs[0].commit, C1);
    ASSERT_STR_EQ(p->revs[0].refs, "main");
    ASSERT_EQ(p->revs[0].n_files, 2);
    ASSERT_EQ(p->revs[0].size, 70000 + strlen("# demo kernel\n"));
    ASSERT_STR_EQ(p->revs[1].refs, "v2");
    ASSERT_STR_EQ(p->warnings, "");
    khub__cache_report_free(r);
    /* a ref to a commit with no snapshot is a warning */
    char path[600];
    snprintf(path, sizeof path, "%s/kernels--org--demo/refs/v9", fx.cache);
    fx_write(path, "9999999999999999999999999999999999999999", 40);
    ASSERT_OK(khub__cache_scan(hub, &r));
    ASSERT_CONTAINS(r->repos[0].warnings, "ref v9 points to a commit with no snapshot");
    khub__cache_report_free(r);
    khub_hub_free(hub);
    /* a cache root that does not exist is an empty cache */
    khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .cache_dir = "/nonexistent/khub-cache",
                       .token = "", .offline = 1};
    ASSERT_OK(khub_hub_new(&o, &hub));
    ASSERT_OK(khub__cache_scan(hub, &r));
    ASSERT_EQ(r->n_repos, 0);
    khub__cache_report_free(r);
    khub_hub_free(hub);
    fx_done(&fx);
}

TEST_IMPL(verify_finds_corrupt_blobs)
{
    fixture fx;
    khub_hub *hub = fill_cache(&fx);
    uint64_t checked = 0, bad = 0;
    seen s = {0};
    ASSERT_OK(khub__cache_verify(hub, NULL, record, &s, &checked, &bad));
    ASSERT_EQ(checked, 3);
    ASSERT_EQ(bad, 0);
    ASSERT_EQ(s.n, 0);
    /* flip a byte in the LFS blob (named by SHA-256) and in a git-SHA-1 blob */
    char lfs[700], reg[700];
    blob_path(&fx, C1, "weights.bin", lfs, sizeof lfs);
    blob_path(&fx, C2, "README.md", reg, sizeof reg);
    FILE *f = fopen(lfs, "r+b");
    ASSERT(f != NULL);
    fputc('#', f);
    fclose(f);
    fx_write(reg, "# demo kernel v3\n", 17);
    ASSERT_STATUS(khub__cache_verify(hub, "org/demo", record, &s, &checked, &bad),
                  KHUB_STATUS_DIGEST_MISMATCH);
    ASSERT_EQ(bad, 2);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "cache verify: 2 of 3 files are corrupt");
    ASSERT(saw(&s, "corrupt", strrchr(lfs, '/')));
    ASSERT(saw(&s, "corrupt", strrchr(reg, '/')));
    ASSERT_STATUS(khub__cache_verify(hub, "org/other", NULL, NULL, &checked, &bad),
                  KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "no repo org/other");
    khub_hub_free(hub);
    fx_done(&fx);
}

TEST_IMPL(prune_detached_and_unreferenced)
{
    fixture fx;
    khub_hub *hub = fill_cache(&fx);
    char repo[600], path[900], outside[600], v2blob[700], keep[700];
    snprintf(repo, sizeof repo, "%s/kernels--org--demo", fx.cache);
    blob_path(&fx, C2, "README.md", v2blob, sizeof v2blob);
    blob_path(&fx, C1, "README.md", keep, sizeof keep);
    /* v2 becomes detached; a stray blob, an in-flight download, and a
     * snapshot link that points outside the cache */
    snprintf(path, sizeof path, "%s/refs/v2", repo);
    ASSERT_EQ(unlink(path), 0);
    snprintf(path, sizeof path, "%s/blobs/%s", repo, "ab" C1 "cdcdcdcdcdcdcdcdcdcdcd");
    fx_write(path, "stray", 5);
    snprintf(path, sizeof path, "%s/blobs/%s.1234abcd.incomplete", repo, C2);
    fx_write(path, "partial", 7);
    snprintf(outside, sizeof outside, "%s/outside.txt", fx.root);
    fx_write(outside, "not the cache's", 15);
    snprintf(path, sizeof path, "%s/snapshots/%s/evil", repo, C2);
    ASSERT_EQ(symlink(outside, path), 0);
    snprintf(path, sizeof path, "%s/snapshots/%s/evil2", repo, C1);
    ASSERT_EQ(symlink(outside, path), 0);

    seen s = {0};
    uint64_t freed = 0;
    ASSERT_OK(khub__cache_prune(hub, 1, record, &s, &freed)); /* dry run */
    ASSERT(saw(&s, "snapshot", C2));
    ASSERT(saw(&s, "blob", strrchr(v2blob, '/')));
    ASSERT(saw(&s, "blob", "cdcdcdcd"));
    ASSERT(access(v2blob, F_OK) == 0); /* nothing removed */
    snprintf(path, sizeof path, "%s/snapshots/%s", repo, C2);
    ASSERT(access(path, F_OK) == 0);

    memset(&s, 0, sizeof s);
    ASSERT_OK(khub__cache_prune(hub, 0, record, &s, &freed));
    ASSERT(freed >= 5 + strlen("# demo kernel v2\n"));
    ASSERT(access(path, F_OK) != 0);
    ASSERT(access(v2blob, F_OK) != 0);
    ASSERT(access(keep, F_OK) == 0);    /* still linked from main */
    ASSERT(access(outside, F_OK) == 0); /* never followed out of the cache */
    snprintf(path, sizeof path, "%s/blobs/%s.1234abcd.incomplete", repo, C2);
    ASSERT(access(path, F_OK) == 0); /* in flight: left alone */
    snprintf(path, sizeof path, "%s/snapshots/%s/README.md", repo, C1);
    char *p = NULL;
    khub_hub_id id = fx_id("org/demo@main");
    ASSERT_OK(khub_hub_download_file(hub, &id, C1, "weights.bin", &p)); /* still cached */
    free(p);
    /* a second prune finds nothing */
    memset(&s, 0, sizeof s);
    ASSERT_OK(khub__cache_prune(hub, 0, record, &s, &freed));
    ASSERT_EQ(s.n, 0);
    ASSERT_EQ(freed, 0);
    /* no refs at all: every snapshot and every complete blob goes */
    snprintf(path, sizeof path, "%s/refs", repo);
    khub__rmtree(path);
    ASSERT_OK(khub__cache_prune(hub, 0, record, &s, &freed));
    ASSERT(freed >= 70000);
    snprintf(path, sizeof path, "%s/snapshots/%s", repo, C1);
    ASSERT(access(path, F_OK) != 0);
    ASSERT(access(keep, F_OK) != 0);
    ASSERT(access(outside, F_OK) == 0);
    khub_hub_free(hub);
    fx_done(&fx);
}

static size_t count_dir(const char *path)
{
    DIR *d = opendir(path);
    size_t n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (de->d_name[0] != '.') n++;
    if (d) closedir(d);
    return n;
}

/* HF_HUB_DISABLE_SYMLINKS (issue 11): snapshot entries that are hard links
 * keep their blobs through prune (they were all removed: no symlink named
 * them); an entry that is a copy (huggingface_hub moves a new blob into the
 * snapshot) counts in ls's size and is verified against trees/<commit>.json,
 * else reported unchecked (it was never looked at). */
TEST_IMPL(disabled_symlinks_layout)
{
    setenv("HF_HUB_DISABLE_SYMLINKS", "1", 1);
    fixture fx;
    khub_hub *hub = fill_cache(&fx);
    unsetenv("HF_HUB_DISABLE_SYMLINKS");
    char repo[600], path[900], blobs[700];
    snprintf(repo, sizeof repo, "%s/kernels--org--demo", fx.cache);
    snprintf(blobs, sizeof blobs, "%s/blobs", repo);
    snprintf(path, sizeof path, "%s/snapshots/%s/README.md", repo, C1);
    struct stat sb;
    ASSERT_EQ(lstat(path, &sb), 0);
    ASSERT(S_ISREG(sb.st_mode) && sb.st_nlink == 2); /* a hard link to its blob */
    const uint64_t total = 70000 + strlen("# demo kernel\n") + strlen("# demo kernel v2\n");
    khub_cache_report *r = NULL;
    ASSERT_OK(khub__cache_scan(hub, &r));
    ASSERT_EQ(r->repos[0].size, total); /* hard links are not counted twice */
    ASSERT_EQ(r->repos[0].revs[0].n_files, 2);
    khub__cache_report_free(r);
    seen s = {0};
    uint64_t freed = 0;
    ASSERT_OK(khub__cache_prune(hub, 0, record, &s, &freed));
    ASSERT_EQ(s.n, 0);
    ASSERT_EQ(count_dir(blobs), 3);
    uint64_t checked = 0, bad = 0;
    ASSERT_OK(khub__cache_verify(hub, NULL, record, &s, &checked, &bad));
    ASSERT_EQ(checked, 3);

    /* huggingface_hub's layout: README.md's bytes only in the snapshot */
    char sha1[41], blob[800];
    ASSERT_OK(khub__git_blob_sha1_buf("# demo kernel\n", 14, sha1));
    snprintf(blob, sizeof blob, "%s/%s", blobs, sha1);
    ASSERT_EQ(unlink(blob), 0);
    ASSERT_OK(khub__cache_scan(hub, &r));
    ASSERT_EQ(r->repos[0].size, total); /* the copy's bytes are on disk */
    khub__cache_report_free(r);
    memset(&s, 0, sizeof s);
    ASSERT_OK(khub__cache_verify(hub, NULL, record, &s, &checked, &bad));
    ASSERT_EQ(checked, 2);
    ASSERT(saw(&s, "unchecked", "README.md")); /* no trees/ file names its hash */
    khub__tree t = {0};
    khub_hub_id id = fx_id("org/demo@main");
    ASSERT_OK(khub__list_tree(hub, &id, C1, "", 1, &t)); /* writes trees/<C1>.json */
    khub__tree_free(&t);
    memset(&s, 0, sizeof s);
    ASSERT_OK(khub__cache_verify(hub, NULL, record, &s, &checked, &bad));
    ASSERT_EQ(checked, 3);
    ASSERT_EQ(s.n, 0);
    fx_write(path, "# demo kernel!\n", 15); /* the copy is damaged */
    memset(&s, 0, sizeof s);
    ASSERT_STATUS(khub__cache_verify(hub, NULL, record, &s, &checked, &bad),
                  KHUB_STATUS_DIGEST_MISMATCH);
    ASSERT_EQ(bad, 1);
    ASSERT(saw(&s, "corrupt", "snapshots/" C1 "/README.md"));
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "cache verify: 1 of 3 files are corrupt");
    /* prune keeps the copy of a referenced snapshot */
    memset(&s, 0, sizeof s);
    ASSERT_OK(khub__cache_prune(hub, 0, record, &s, &freed));
    ASSERT_EQ(s.n, 0);
    ASSERT(access(path, F_OK) == 0);
    khub_hub_free(hub);
    fx_done(&fx);
}

#define TEST_LIST(X) \
    X(scan_lists_repos_and_revisions) \
    X(verify_finds_corrupt_blobs) \
    X(prune_detached_and_unreferenced) \
    X(disabled_symlinks_layout)
TEST_MAIN(TEST_LIST)
