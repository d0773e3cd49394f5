/*
 * serve_app.c: an outside program on the installed libkhub_server and
 * libkhub (tests/t_install.sh builds it with pkg-config khub-server and with
 * find_package's khub::khub_server): serves an empty repos folder, asks it
 * for a repo through the hub client, and shows a start failure's message.
 *
 *   serve_app DIR   prints "port N", "resolve KHUB_STATUS_REPO_NOT_FOUND",
 *                   "requests N" and "bad dir KHUB_STATUS_NOT_FOUND: <message>"
 */
#include <stdio.h>

#include <khub/khub_hub.h>
#include <khub/khub_server.h>

int main(int argc, char **argv)
{
    if (argc != 2) return fprintf(stderr, "usage: serve_app DIR\n"), 2;
    khub_server_opts so = {KHUB_APP_INIT(khub_server_opts), .dir = argv[1], .faults = ""};
    khub_server *srv = NULL;
    char err[KHUB_ERROR_SIZE];
    if (khub_server_start(&so, &srv, err, sizeof err) != KHUB_STATUS_OK)
        return fprintf(stderr, "serve_app: %s\n", err), 1;
    printf("port %u\n", khub_server_port(srv));
    char endpoint[64], commit[41];
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%u", khub_server_port(srv));
    khub_hub_opts ho = {KHUB_APP_INIT(khub_hub_opts),
                        .endpoint = endpoint,
                        .cache_dir = argv[1],
                        .token = "",
                        .offline = 0,
                        .max_tries = 1};
    khub_hub *hub = NULL;
    khub_hub_id id;
    if (khub_hub_new(&ho, &hub) != KHUB_STATUS_OK ||
        khub_hub_id_parse("acme/none", &id, err, sizeof err) != KHUB_STATUS_OK)
        return fprintf(stderr, "serve_app: %s\n", khub_last_error()), 1;
    printf("resolve %s\n", khub_status_name(khub_hub_resolve(hub, &id, commit)));
    khub_hub_free(hub);
    printf("requests %llu\n", (unsigned long long)khub_server_request_count(srv));
    khub_server_stop(srv);
    so.dir = "/nonexistent/khub-repos";
    khub_status st = khub_server_start(&so, &srv, err, sizeof err);
    printf("bad dir %s: %s\n", khub_status_name(st), err);
    return srv == NULL && st == KHUB_STATUS_NOT_FOUND ? 0 : 1;
}
