/*
 * author_app.c: an outside program on the installed libkhub_author and
 * libkhub (tests/t_install.sh builds it with pkg-config khub-author): lists
 * the init templates embedded in the library and shows an out-of-range
 * template's refusal.
 *
 *   author_app   prints "templates N", one "template KIND OP cuda=C" line a
 *                template, and "out of range KHUB_STATUS_INVALID_ARG"
 */
#include <stdio.h>

#include <khub/khub_author.h>

int main(void)
{
    size_t n = khub_author_template_count();
    printf("templates %zu\n", n);
    for (size_t i = 0; i < n; i++) {
        khub_author_template t = {KHUB_APP_INIT(khub_author_template)};
        khub_status st = khub_author_template_at(i, &t);
        if (st != KHUB_STATUS_OK)
            return fprintf(stderr, "author_app: template %zu: %s\n", i, khub_last_error()), 1;
        printf("template %s %s cuda=%d\n", t.kind, t.op, (int)t.cuda);
    }
    khub_author_template t = {KHUB_APP_INIT(khub_author_template)};
    printf("out of range %s\n", khub_status_name(khub_author_template_at(n, &t)));
    return 0;
}
