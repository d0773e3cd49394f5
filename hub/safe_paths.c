/*
 * safe_paths.c: the checks on names that come from a hub or a client (a
 * repo-relative path, a commit id) and the removal of a tree that never
 * follows a link out of it. The hub server (libkhub_server) calls these
 * through libkhub's KHUB_PRIVATE_API exports (abi/SYMBOLS.md, "Private").
 */
#include <ftw.h>
#include <string.h>
#include <unistd.h>

#include "hub_impl.h"

bool khub__path_is_safe(const char *rel)
{
    if (!rel || !rel[0] || rel[0] == '/' || strlen(rel) > 1024) return false;
    if (((rel[0] | 0x20) >= 'a' && (rel[0] | 0x20) <= 'z') && rel[1] == ':') return false;
    const char *seg = rel;
    for (const char *p = rel;; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '/' || c == '\0') {
            size_t n = (size_t)(p - seg);
            if (n == 0) return false;
            if (n == 1 && seg[0] == '.') return false;
            if (n == 2 && seg[0] == '.' && seg[1] == '.') return false;
            if (c == '\0') return true;
            seg = p + 1;
        } else if (c < 0x20 || c == 0x7f || c == '\\') {
            return false;
        }
    }
}

bool khub__is_commit_hex(const char *s)
{
    if (!s) return false;
    for (int i = 0; i < 40; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return s[40] == '\0';
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)ftw;
    if (flag == FTW_DP)
        rmdir(path);
    else
        unlink(path);
    return 0;
}

void khub__rmtree(const char *path) { nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS); }
