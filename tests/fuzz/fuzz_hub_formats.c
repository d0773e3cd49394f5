/* fuzz_hub_formats.c: libFuzzer target for every parser of the hub side,
 * all of which read bytes a hub, a publisher or a project can choose.
 *
 * The first input byte (mod 12) picks the parser; the rest is its input:
 *   0 Hub ID (org/name@rev:symbol)      6 trust policy
 *   1 a tree listing page (API JSON)    7 metadata.json.sig
 *   2 metadata.json                     8 a public key line
 *   3 kernel.json                       9 a .../refs answer, resolved to a
 *   4 khub.json (kernel mapping)          version (the first byte / 12 - 1)
 *   5 khub.lock                        10 a .../revision/<rev> answer
 *                                      11 a .../refs answer, every version
 * The server answers (1, 9-11) are parsed from an exact-size heap copy
 * without a NUL, as the client reads them with a length.
 * Any input may be refused; none may crash, leak or read out of bounds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hub_impl.h"
#include "kernel_manifest.h"
#include "kernel_mapping.h"
#include "kernel_meta.h"
#include "lockfile.h"
#include "trust.h"

static khub_hub *offline_hub(void)
{
    static khub_hub *hub;
    if (!hub) {
        khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .cache_dir = "/nonexistent",
                           .offline = 1};
        if (khub_hub_new(&o, &hub) != KHUB_STATUS_OK) abort();
    }
    return hub;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    /* NUL-terminated copy: some parsers take C strings, and none may rely
     * on the terminator being there when given a length. */
    char *s = malloc(size);
    if (!s) return 0;
    memcpy(s, data + 1, size - 1);
    s[size - 1] = '\0';
    size_t n = size - 1;
    char *exact = malloc(n ? n : 1); /* no NUL after it */
    if (!exact) {
        free(s);
        return 0;
    }
    memcpy(exact, data + 1, n);
    char err[512];
    khub_hub_id id = {.org = "org", .name = "name", .revision = "main"};
    switch (data[0] % 12) {
    case 0: {
        khub_hub_id id;
        (void)khub_hub_id_parse(s, &id, err, sizeof err);
        break;
    }
    case 1: {
        khub__tree t = {0};
        (void)khub__tree_parse(offline_hub(), exact, n, &t);
        khub__tree_free(&t);
        break;
    }
    case 2: {
        static khub_kmeta m;
        (void)khub__kmeta_parse(s, n, &m, err, sizeof err);
        break;
    }
    case 3: {
        static khub_kernel_manifest km;
        (void)khub__km_parse(s, n, "/nonexistent", &km, err, sizeof err);
        break;
    }
    case 4: {
        khub_mapping *m = NULL;
        if (khub__mapping_parse(s, n, &m, err, sizeof err) == KHUB_STATUS_OK) free(m);
        break;
    }
    case 5: {
        khub_lock *l = NULL;
        if (khub__lock_parse(s, n, &l, err, sizeof err) == KHUB_STATUS_OK) khub__lock_free(l);
        break;
    }
    case 6: {
        khub_trust_policy *p = NULL;
        if (khub__trust_policy_parse(s, n, &p, err, sizeof err) == KHUB_STATUS_OK)
            khub__trust_policy_free(p);
        break;
    }
    case 7: { /* both formats; a format-2 statement is rebuilt as signed text */
        khub_sig sig;
        char text[1024];
        if (khub__sig_parse_full(s, n, &sig, err, sizeof err) == KHUB_STATUS_OK && sig.format == 2)
            (void)khub__sig_statement_text(&sig.stmt, text, sizeof text);
        break;
    }
    case 8: {
        khub_pubkey k;
        (void)khub__pubkey_parse(s, &k);
        break;
    }
    case 9: {
        char rev[KHUB_HUB_REV_MAX + 1], commit[41];
        (void)khub__refs_resolve(offline_hub(), &id, exact, n, (int32_t)(data[0] / 12) - 1, rev,
                                 sizeof rev, commit);
        break;
    }
    case 10: {
        char commit[41];
        (void)khub__revision_sha(offline_hub(), &id, exact, n, commit);
        break;
    }
    default: {
        int32_t newest, all[64];
        size_t n_all;
        char commit[41];
        if (khub__refs_versions(offline_hub(), "fuzz", exact, n, &newest, commit, all, 64,
                                &n_all) == KHUB_STATUS_OK &&
            (n_all > 64 || (newest >= 0 && strlen(commit) != 40)))
            abort();
        break;
    }
    }
    free(exact);
    free(s);
    return 0;
}
