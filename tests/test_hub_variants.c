/* test_hub_variants.c: variant listing and ranking, verified variant
 * downloads, and the hostile-archive unpacker. */
#include <archive.h>
#include <archive_entry.h>

#include <time.h>

#include "dir_list.h"
#include "hub_fixture.h"

TEST_IMPL(list_and_rank)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@main");
    khub_hub_variant_list *vl = NULL;
    ASSERT_OK(khub_hub_variants(hub, &id, C1, &vl));
    ASSERT_EQ(vl->count, 2);
    ASSERT_STR_EQ(vl->best, fx.variant);
    ASSERT_CONTAINS(vl->items[0].reason, "accept: CPU build");
    /* the trace names the host's CPU features the load will choose a level by */
    ASSERT_CONTAINS(vl->items[0].reason, "(level chosen at load; host CPU: ");
    if (khub_cpu_features() & KHUB_CPU_AVX2) ASSERT_CONTAINS(vl->items[0].reason, " avx2");
    ASSERT_STR_EQ(vl->items[1].name, "torch212-cxx11-cu130-x86_64-linux");
    ASSERT_EQ(vl->items[1].accepted, 0);
    ASSERT_CONTAINS(vl->items[1].reason, "torch family needs libtorch");
    khub_hub_variant_list_free(vl);
    khub_hub_free(hub);
    fx_done(&fx);
}

static const khub_hub_variant *find_variant(const khub_hub_variant_list *vl, const char *name)
{
    for (size_t i = 0; i < vl->count; i++)
        if (!strcmp(vl->items[i].name, name)) return &vl->items[i];
    TEST_FAIL_("variant %s is not listed", name);
    return NULL;
}

/* Every way a name can fail this host, each with its reason; nothing
 * crashes on an unknown name, and the one fitting variant ranks first. */
TEST_IMPL(rejections_have_reasons)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    const char *arch = fx_arch(), *other = strcmp(arch, "x86_64") ? "x86_64" : "aarch64";
    char names[8][96], want[8][128];
    snprintf(names[0], 96, "khub1-cpu-%s-linux", arch);
    snprintf(want[0], 128, "accept: CPU build for %s", arch);
    snprintf(names[1], 96, "khub1-cpu-%s-linux", other);
    snprintf(want[1], 128, "reject: built for %s, host is %s", other, arch);
    snprintf(names[2], 96, "khub1-cpu-%s-darwin", arch);
    snprintf(want[2], 128, "reject: built for darwin, host is linux");
    snprintf(names[3], 96, "khub9-cpu-%s-linux", arch);
    snprintf(want[3], 128, "reject: ABI major 9, host has %d", KHUB_ABI_MAJOR);
    snprintf(names[4], 96, "tvm-ffi01-cpu-%s-linux", arch);
    snprintf(want[4], 128, "reject: tvm-ffi family needs libtvm_ffi");
    snprintf(names[5], 96, "khub1-rocm62-%s-linux", arch);
    snprintf(want[5], 128, "reject: unknown backend \"rocm62\"");
    snprintf(names[6], 96, "khub1-cpu-%s-linux-extra", arch);
    snprintf(want[6], 128, "reject: not a khub{ABI}-{backend}-{cpu}-{os} name");
    snprintf(names[7], 96, "_weird-");
    snprintf(want[7], 128, "reject: not a khub{ABI}-{backend}-{cpu}-{os} name");
    for (int i = 0; i < 8; i++) {
        char rel[300];
        snprintf(rel, sizeof rel, "org/demo/commits/" C2 "/build/%s/f.so", names[i]);
        fx_writef(&fx, rel, "x");
    }
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@" C2);
    khub_hub_variant_list *vl = NULL;
    ASSERT_OK(khub_hub_variants(hub, &id, C2, &vl));
    ASSERT_EQ(vl->count, 8);
    ASSERT_STR_EQ(vl->best, names[0]);
    ASSERT_STR_EQ(vl->items[0].name, names[0]);
    for (int i = 0; i < 8; i++) {
        const khub_hub_variant *v = find_variant(vl, names[i]);
        ASSERT_CONTAINS(v->reason, want[i]);
        ASSERT_EQ(v->accepted, i == 0);
        ASSERT_EQ(v->rank < 0, i != 0);
    }
    khub_hub_variant_list_free(vl);
    khub_hub_free(hub);
    fx_done(&fx);
}

TEST_IMPL(download_verified_then_offline)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@main");
    khub_hub_file_list *fl = NULL;
    ASSERT_OK(khub_hub_download_variant(hub, &id, C1, fx.variant, &fl));
    ASSERT_EQ(fl->count, 1);
    ASSERT_STR_EQ(fl->items[0].rel, "libk.so");
    ASSERT_CONTAINS(fl->items[0].path, "/blobs/");
    char sha[65];
    ASSERT_OK(khub__sha256_file_hex(fl->items[0].path, sha));
    ASSERT_STR_EQ(sha, fl->items[0].sha256);
    char blob[4096];
    snprintf(blob, sizeof blob, "%s", fl->items[0].path);
    khub_hub_file_list_free(fl);
    khub_hub_free(hub);
    /* offline: variants from the snapshot, files verified again */
    hub = fx_hub(&fx, 1, NULL);
    khub_hub_variant_list *vl = NULL;
    ASSERT_OK(khub_hub_variants(hub, &id, C1, &vl));
    ASSERT_STR_EQ(vl->best, fx.variant);
    khub_hub_variant_list_free(vl);
    ASSERT_OK(khub_hub_variant_files(hub, &id, C1, fx.variant, &fl));
    khub_hub_file_list_free(fl);
    /* tampering with the cached bytes is caught before anything loads them */
    FILE *f = fopen(blob, "r+b");
    ASSERT(f != NULL);
    fputc('Z', f);
    fclose(f);
    ASSERT_STATUS(khub_hub_variant_files(hub, &id, C1, fx.variant, &fl),
                  KHUB_STATUS_DIGEST_MISMATCH);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "metadata.json says");
    ASSERT_EQ(khub_hub_request_count(hub), 0);
    khub_hub_free(hub);
    fx_done(&fx);
}

/* Writes a .tar.gz with one entry of the given type, name and link. */
static void make_tar(const char *path, const char *name, mode_t type, const char *link, size_t size,
                     char fill)
{
    struct archive *a = archive_write_new();
    archive_write_add_filter_gzip(a);
    archive_write_set_format_pax_restricted(a);
    ASSERT_EQ(archive_write_open_filename(a, path), ARCHIVE_OK);
    struct archive_entry *e = archive_entry_new();
    archive_entry_set_pathname(e, name);
    archive_entry_set_filetype(e, type);
    archive_entry_set_perm(e, 0644);
    if (link && type == AE_IFLNK) archive_entry_set_symlink(e, link);
    if (link && type == AE_IFREG) archive_entry_set_hardlink(e, link);
    archive_entry_set_size(e, type == AE_IFREG && !link ? (la_int64_t)size : 0);
    archive_write_header(a, e);
    if (type == AE_IFREG && !link) {
        static char buf[1 << 16];
        memset(buf, fill, sizeof buf);
        for (size_t left = size; left > 0;) {
            size_t n = left < sizeof buf ? left : sizeof buf;
            archive_write_data(a, buf, n);
            left -= n;
        }
    }
    archive_entry_free(e);
    archive_write_close(a);
    archive_write_free(a);
}

static void expect_refused_within(const char *name, mode_t type, const char *link, size_t size,
                                  const khub__unpack_limits *lim, khub_status want, const char *msg)
{
    char dir[] = "/tmp/khub-arch-XXXXXX";
    ASSERT(mkdtemp(dir) != NULL);
    char tar[256], dest[256];
    snprintf(tar, sizeof tar, "%s/a.tar.gz", dir);
    snprintf(dest, sizeof dest, "%s/out", dir);
    make_tar(tar, name, type, link, size, 0);
    khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .cache_dir = dir, .offline = 1};
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&o, &hub));
    ASSERT_STATUS(khub__archive_unpack(hub, tar, dest, lim), want);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), msg);
    ASSERT(access(dest, F_OK) != 0); /* nothing left behind */
    khub_hub_free(hub);
    khub__rmtree(dir);
}

static void expect_refused(const char *name, mode_t type, const char *link, size_t size,
                           khub_status want, const char *msg)
{
    expect_refused_within(name, type, link, size, NULL, want, msg);
}

TEST_IMPL(archive_hostile_entries)
{
    expect_refused("../evil.so", AE_IFREG, NULL, 4, KHUB_STATUS_UNSAFE_PATH, "has \"..\"");
    expect_refused("/etc/evil", AE_IFREG, NULL, 4, KHUB_STATUS_UNSAFE_PATH, "absolute");
    expect_refused("link", AE_IFLNK, "../../outside", 0, KHUB_STATUS_UNSAFE_PATH, "is a link");
    expect_refused("fifo", AE_IFIFO, NULL, 0, KHUB_STATUS_UNSAFE_PATH, "FIFO");
    expect_refused("dev", AE_IFCHR, NULL, 0, KHUB_STATUS_UNSAFE_PATH, "device");
    /* 64 MiB of zeros packs to ~64 KiB: over the 200:1 ratio */
    expect_refused("bomb.bin", AE_IFREG, NULL, 64u << 20, KHUB_STATUS_OVERFLOW, "ratio");
    expect_refused("hard", AE_IFREG, "libk.so", 0, KHUB_STATUS_UNSAFE_PATH, "is a link");
    /* oversize: one entry over the entry limit (its header says so), or
     * the whole archive over the total */
    khub__unpack_limits entry = {.max_entry_bytes = 100}, total = {.max_total_bytes = 500};
    expect_refused_within("big.so", AE_IFREG, NULL, 1000, &entry, KHUB_STATUS_OVERFLOW,
                          "entry \"big.so\" is 1000 bytes, over the 100 limit");
    expect_refused_within("big.so", AE_IFREG, NULL, 1000, &total, KHUB_STATUS_OVERFLOW,
                          "unpacks to over the size or ratio limit");
}

TEST_IMPL(archive_ok_unpacks)
{
    char dir[] = "/tmp/khub-arch-XXXXXX";
    ASSERT(mkdtemp(dir) != NULL);
    char tar[256], dest[256], file[300];
    snprintf(tar, sizeof tar, "%s/a.tar.gz", dir);
    snprintf(dest, sizeof dest, "%s/out", dir);
    make_tar(tar, "libk.so", AE_IFREG, NULL, 1000, 'k');
    khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .cache_dir = dir, .offline = 1};
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&o, &hub));
    ASSERT_OK(khub__archive_unpack(hub, tar, dest, NULL));
    snprintf(file, sizeof file, "%s/libk.so", dest);
    struct stat sb;
    ASSERT_EQ(stat(file, &sb), 0);
    ASSERT_EQ(sb.st_size, 1000);
    khub_hub_free(hub);
    khub__rmtree(dir);
}

/* The fixture started and org/demo@main's variant downloaded into its
 * cache (the hub freed); blob, if not NULL, gets the path of its file. */
static void fx_downloaded(fixture *fx, char blob[4096])
{
    fx_init(fx, NULL, 0);
    khub_hub *hub = fx_hub(fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@main");
    khub_hub_file_list *fl = NULL;
    ASSERT_OK(khub_hub_download_variant(hub, &id, C1, fx->variant, &fl));
    if (blob) snprintf(blob, 4096, "%s", fl->items[0].path);
    khub_hub_file_list_free(fl);
    khub_hub_free(hub);
}

/* The "inside the cache" check on canonical paths (hub/variant.c real_dir):
 * a cache reached through a link verifies, and a listed file whose link
 * leads outside the cache is refused with the real path it resolves to. */
TEST_IMPL(cache_through_a_link_and_a_file_outside)
{
    fixture fx;
    char blob[4096];
    fx_downloaded(&fx, blob);
    khub_hub *hub = NULL;
    khub_hub_id id = fx_id("org/demo@main");
    khub_hub_file_list *fl = NULL;

    char link[400];
    snprintf(link, sizeof link, "%s/cache-link", fx.root);
    ASSERT_EQ(symlink(fx.cache, link), 0);
    khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .endpoint = fx.endpoint, .cache_dir = link,
                       .token = "", .offline = 1};
    ASSERT_OK(khub_hub_new(&o, &hub));
    ASSERT_OK(khub_hub_variant_files(hub, &id, C1, fx.variant, &fl));
    ASSERT_EQ(fl->count, 1);
    ASSERT_STR_EQ(fl->items[0].path, blob); /* the canonical path, under fx.cache */
    khub_hub_file_list_free(fl);

    /* the same bytes, outside the cache, linked in as the listed file */
    char outside[400], real[4096], entry[1200], cmd[1300];
    snprintf(outside, sizeof outside, "%s/outside.so", fx.root);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", blob, outside);
    ASSERT_EQ(system(cmd), 0);
    ASSERT(realpath(outside, real) != NULL);
    char dir[1000];
    snprintf(dir, sizeof dir, "%s/kernels--org--demo/snapshots/" C1 "/build/%s", link, fx.variant);
    snprintf(entry, sizeof entry, "%s/libk.so", dir);
    ASSERT_EQ(unlink(entry), 0);
    ASSERT_EQ(symlink(outside, entry), 0);
    ASSERT_STATUS(khub_hub_variant_files(hub, &id, C1, fx.variant, &fl), KHUB_STATUS_UNSAFE_PATH);
    char want[KHUB_ERROR_SIZE];
    snprintf(want, sizeof want, "%s: libk.so resolves outside the cache (%s)", dir, real);
    ASSERT_STR_EQ(khub_hub_errmsg(hub), want);
    ASSERT(fl == NULL);
    ASSERT_EQ(khub_hub_request_count(hub), 0);
    khub_hub_free(hub);
    fx_done(&fx);
}

/* The variant folder's real path is derived from the repo folder's only
 * when nothing between them is a link (hub/real_path.c): a variant folder
 * that is itself a link is resolved in full, so a link to a copy outside
 * the cache is refused with the real path of its file, and a link to a
 * folder elsewhere inside the repo folder verifies with canonical paths. */
TEST_IMPL(variant_folder_through_a_link)
{
    fixture fx;
    fx_downloaded(&fx, NULL);
    khub_hub *hub = NULL;
    khub_hub_id id = fx_id("org/demo@main");
    khub_hub_file_list *fl = NULL;

    char dir[1000], repo[600], copy[1100], cmd[3000], real[4096], want[KHUB_ERROR_SIZE];
    snprintf(repo, sizeof repo, "%s/kernels--org--demo", fx.cache);
    snprintf(dir, sizeof dir, "%s/snapshots/" C1 "/build/%s", repo, fx.variant);
    /* outside the cache: a copy with the links to the blobs followed */
    snprintf(copy, sizeof copy, "%s/outside-variant", fx.root);
    snprintf(cmd, sizeof cmd, "cp -rL '%s' '%s' && rm -r '%s' && ln -s '%s' '%s'", dir, copy, dir,
             copy, dir);
    ASSERT_EQ(system(cmd), 0);
    ASSERT(realpath(copy, real) != NULL);
    hub = fx_hub(&fx, 1, NULL);
    ASSERT_STATUS(khub_hub_variant_files(hub, &id, C1, fx.variant, &fl), KHUB_STATUS_UNSAFE_PATH);
    snprintf(want, sizeof want, "%s: libk.so resolves outside the cache (%s/libk.so)", dir, real);
    ASSERT_STR_EQ(khub_hub_errmsg(hub), want);
    ASSERT(fl == NULL);
    khub_hub_free(hub);

    /* inside the repo folder, through the same link: verified, canonical */
    snprintf(copy, sizeof copy, "%s/elsewhere", repo);
    snprintf(cmd, sizeof cmd, "mv '%s/outside-variant' '%s' && rm '%s' && ln -s '%s' '%s'", fx.root,
             copy, dir, copy, dir);
    ASSERT_EQ(system(cmd), 0);
    ASSERT(realpath(copy, real) != NULL);
    hub = fx_hub(&fx, 1, NULL);
    ASSERT_OK(khub_hub_variant_files(hub, &id, C1, fx.variant, &fl));
    ASSERT_EQ(fl->count, 1);
    snprintf(want, sizeof want, "%s/libk.so", real);
    ASSERT_STR_EQ(fl->items[0].path, want);
    khub_hub_file_list_free(fl);
    ASSERT_EQ(khub_hub_request_count(hub), 0);
    khub_hub_free(hub);
    fx_done(&fx);
}

/* A cache path written with ".", ".." or "//" reaches the same files
 * through no link, yet is not canonical: the "inside the cache" check
 * compares canonical paths, so such a cache verifies, with the canonical
 * path of each file (hub/real_path.c takes a path as written only when it
 * has plain components and the kernel finds no link on it). */
TEST_IMPL(cache_path_with_dots_is_made_canonical)
{
    fixture fx;
    char blob[4096];
    fx_downloaded(&fx, blob);
    khub_hub *hub = NULL;
    khub_hub_id id = fx_id("org/demo@main");
    khub_hub_file_list *fl = NULL;

    char sub[400], cache[3][500];
    snprintf(sub, sizeof sub, "%s/sub", fx.root);
    ASSERT_EQ(mkdir(sub, 0755), 0);
    snprintf(cache[0], sizeof cache[0], "%s/sub/../cache", fx.root);
    snprintf(cache[1], sizeof cache[1], "%s/./cache", fx.root);
    snprintf(cache[2], sizeof cache[2], "%s//cache", fx.root);
    for (int i = 0; i < 3; i++) {
        khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .endpoint = fx.endpoint,
                           .cache_dir = cache[i], .token = "", .offline = 1};
        ASSERT_OK(khub_hub_new(&o, &hub));
        ASSERT_OK(khub_hub_variant_files(hub, &id, C1, fx.variant, &fl));
        ASSERT_EQ(fl->count, 1);
        ASSERT_STR_EQ(fl->items[0].path, blob);
        khub_hub_file_list_free(fl);
        khub_hub_free(hub);
    }
    fx_done(&fx);
}

/* The listing of a variant folder is kept within the process while the
 * folder's stat stays the same (hub/dir_list.c): a second verify of an
 * unchanged, settled folder takes it from the memo; a name added to the
 * folder moves its mtime and ctime, so the next verify lists it afresh and
 * refuses the unlisted file; a folder changed less than 2 s ago is listed
 * every time (racily clean), never kept. */
TEST_IMPL(kept_listing_follows_the_folder)
{
    fixture fx;
    fx_downloaded(&fx, NULL);
    khub_hub *hub = NULL;
    khub_hub_id id = fx_id("org/demo@main");
    khub_hub_file_list *fl = NULL;
    char dir[1000], extra[1100], want[KHUB_ERROR_SIZE];
    snprintf(dir, sizeof dir, "%s/kernels--org--demo/snapshots/" C1 "/build/%s", fx.cache,
             fx.variant);
    snprintf(extra, sizeof extra, "%s/extra.bin", dir);
    struct timespec settle = {2, 200 * 1000 * 1000};
    nanosleep(&settle, NULL);

    hub = fx_hub(&fx, 1, NULL);
    size_t hits = khub__dir_list_kept_hits();
    for (int i = 0; i < 2; i++) {
        ASSERT_OK(khub_hub_variant_files(hub, &id, C1, fx.variant, &fl));
        khub_hub_file_list_free(fl);
    }
    ASSERT_EQ(khub__dir_list_kept_hits(), hits + 1); /* the second from the memo */

    FILE *f = fopen(extra, "wb");
    ASSERT(f != NULL);
    fclose(f);
    ASSERT_STATUS(khub_hub_variant_files(hub, &id, C1, fx.variant, &fl),
                  KHUB_STATUS_METADATA_INVALID);
    snprintf(want, sizeof want,
             "%s: extra.bin is not listed in metadata.json; refusing the variant", dir);
    ASSERT_STR_EQ(khub_hub_errmsg(hub), want);
    ASSERT(fl == NULL);

    ASSERT_EQ(unlink(extra), 0); /* changed just now: listed afresh, twice */
    for (int i = 0; i < 2; i++) {
        ASSERT_OK(khub_hub_variant_files(hub, &id, C1, fx.variant, &fl));
        khub_hub_file_list_free(fl);
    }
    ASSERT_EQ(khub__dir_list_kept_hits(), hits + 1);
    ASSERT_EQ(khub_hub_request_count(hub), 0);
    khub_hub_free(hub);
    fx_done(&fx);
}

#define TEST_LIST(X) \
    X(list_and_rank) \
    X(rejections_have_reasons) \
    X(download_verified_then_offline) \
    X(archive_hostile_entries) \
    X(archive_ok_unpacks) \
    X(cache_through_a_link_and_a_file_outside) \
    X(variant_folder_through_a_link) \
    X(cache_path_with_dots_is_made_canonical) \
    X(kept_listing_follows_the_folder)
TEST_MAIN(TEST_LIST)
