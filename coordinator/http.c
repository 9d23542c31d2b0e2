/*
 * coordinator/http: the minimal HTTP/1.0 listener on --metrics HOST:PORT, served from
 * tided's event loop: non-blocking sockets polled by zmq_poll next to the ROUTER socket,
 * one response per connection, then close, a client that stalls cut after 5 s. It serves
 * /metrics (metrics.c) and the live cluster page, / and /api/cluster (page.c).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/http.h"
#include "coordinator/metrics.h"
#include "coordinator/page.h"

#define HTTP_TIMEOUT_NS (5ull * 1000000000ull)
#define CLIENTS         16   /* scrapers and pages served at once */
#define REQ_MAX         4096 /* bytes of one HTTP request head */

typedef struct http_client {
    int fd; /* -1: slot free */
    char req[REQ_MAX];
    size_t req_len;
    char *resp; /* tide_malloc'd response being written */
    size_t resp_len, resp_at;
    uint64_t started_ns;
} http_client;

struct tide__metrics {
    int fd; /* the listener */
    http_client http[CLIENTS];
};

static int poll_items(tide_server_t *s, zmq_pollitem_t *items, int max);
static void handle(tide_server_t *s, const zmq_pollitem_t *items, int n);

tide_status tide__http_open(tide_server_t *s, const char *addr)
{
    char host[64];
    const char *colon = strrchr(addr, ':');
    if (colon == NULL || (size_t)(colon - addr) >= sizeof host)
        return tide_errorf(TIDE_ERR_INVALID, "--metrics '%s': expected HOST:PORT (127.0.0.1:9400)",
                           addr);
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    char *end = NULL;
    long port = strtol(colon + 1, &end, 10);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    if (end == colon + 1 || *end != '\0' || port < 0 || port > 65535 ||
        inet_pton(AF_INET, host[0] ? host : "0.0.0.0", &sa.sin_addr) != 1)
        return tide_errorf(TIDE_ERR_INVALID,
                           "--metrics '%s': expected an IPv4 HOST:PORT (127.0.0.1:9400)", addr);
    sa.sin_port = htons((uint16_t)port);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return tide_errorf(TIDE_ERR_IO, "metrics socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 16) != 0) {
        tide_status rc =
            tide_errorf(TIDE_ERR_IO, "cannot listen for metrics on %s: %s", addr, strerror(errno));
        close(fd);
        return rc;
    }
    s->metrics = tide_calloc(1, sizeof *s->metrics);
    if (s->metrics == NULL) {
        close(fd);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory starting the metrics listener");
    }
    s->metrics->fd = fd;
    for (int i = 0; i < CLIENTS; i++)
        s->metrics->http[i].fd = -1;
    tide__on_poll(s, poll_items, handle);
    TIDE_INFO("metrics", "Prometheus metrics on http://%s/metrics, the cluster page on http://%s/",
              addr, addr);
    if (strncmp(host, "127.", 4) != 0 && strcmp(host, "localhost") != 0)
        TIDE_WARN("metrics",
                  "--metrics %s is reachable from other hosts and has no authentication: "
                  "anyone who can connect reads job names and cluster state (bind 127.0.0.1 "
                  "and scrape through a proxy, or firewall the port)",
                  addr);
    return TIDE_OK;
}

void tide__http_close(tide_server_t *s)
{
    tide__metrics *mx = s->metrics;
    if (mx == NULL)
        return;
    for (int i = 0; i < CLIENTS; i++) {
        if (mx->http[i].fd >= 0)
            close(mx->http[i].fd);
        tide_free(mx->http[i].resp);
    }
    close(mx->fd);
    tide_free(mx);
    s->metrics = NULL;
}

/* Poll source: the listener, and each client for its request or its response's room. */
static int poll_items(tide_server_t *s, zmq_pollitem_t *items, int max)
{
    tide__metrics *mx = s->metrics;
    int n = 0;
    if (max < 1)
        return 0;
    items[n++] = (zmq_pollitem_t){NULL, mx->fd, ZMQ_POLLIN, 0};
    for (int i = 0; i < CLIENTS && n < max; i++) {
        http_client *h = &mx->http[i];
        if (h->fd >= 0)
            items[n++] = (zmq_pollitem_t){NULL, h->fd, h->resp ? ZMQ_POLLOUT : ZMQ_POLLIN, 0};
    }
    return n;
}

static void http_close(http_client *h)
{
    close(h->fd);
    tide_free(h->resp);
    memset(h, 0, sizeof *h);
    h->fd = -1;
}

/* 1 when the request's target is path (a query string after it is ignored). */
static int target_is(const char *target, const char *path)
{
    size_t n = strlen(path);
    return strncmp(target, path, n) == 0 &&
           (target[n] == ' ' || target[n] == '?' || target[n] == '\r' || target[n] == '\n');
}

/* The page: its own script and style only, its data from this address, nothing else
   loaded, never framed, never cached. */
#define PAGE_HEADERS                                                                          \
    "Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; style-src "    \
    "'unsafe-inline'; connect-src 'self'; img-src data:; frame-ancestors 'none'\r\n"        \
    "X-Content-Type-Options: nosniff\r\nCache-Control: no-store\r\n"

/* The response to h's request: GET /metrics, GET / (the cluster page), GET /api/cluster
   (its data); anything else 404, other methods 405, a head that filled the buffer 431. */
static void respond(tide_server_t *s, http_client *h, int complete)
{
    char *body = NULL;
    size_t blen = 0;
    const char *status = "200 OK", *type = "text/plain; charset=utf-8", *extra = "";
    const char *target = h->req + 4;
    tide_status rc = TIDE_OK;
    if (!complete) {
        status = "431 Request Header Fields Too Large";
    } else if (strncmp(h->req, "GET ", 4) != 0) {
        status = "405 Method Not Allowed";
        extra = "Allow: GET\r\n";
    } else if (target_is(target, "/metrics")) {
        type = "text/plain; version=0.0.4";
        rc = tide__metrics_render(s, &body, &blen);
    } else if (target_is(target, "/api/cluster")) {
        type = "application/json";
        extra = "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n";
        rc = tide__page_cluster_json(s, &body, &blen);
    } else if (target_is(target, "/")) {
        type = "text/html; charset=utf-8";
        extra = PAGE_HEADERS;
        blen = tide__page_html_len;
    } else {
        status = "404 Not Found";
    }
    if (rc != TIDE_OK) {
        status = "500 Internal Server Error";
        blen = 0;
    }
    const void *src = body != NULL ? (const void *)body
                      : blen ? (const void *)tide__page_html : (const void *)"";
    char head[640];
    int hn = snprintf(head, sizeof head,
                      "HTTP/1.0 %s\r\nContent-Type: %s\r\n%sContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n",
                      status, type, extra, blen);
    h->resp = tide_malloc((size_t)hn + blen);
    if (h->resp == NULL) {
        tide_free(body);
        http_close(h);
        return;
    }
    memcpy(h->resp, head, (size_t)hn);
    if (blen)
        memcpy(h->resp + hn, src, blen);
    h->resp_len = (size_t)hn + blen;
    h->resp_at = 0;
    tide_free(body);
}

/* Poll source: accepts scrapers, reads their requests, writes the responses. */
static void handle(tide_server_t *s, const zmq_pollitem_t *items, int n)
{
    tide__metrics *mx = s->metrics;
    uint64_t now = tide_now_ns();
    for (int k = 0; k < n; k++) {
        if (items[k].fd == mx->fd) {
            if (!(items[k].revents & ZMQ_POLLIN))
                continue;
            int fd;
            while ((fd = accept4(mx->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                int slot = -1;
                for (int i = 0; i < CLIENTS && slot < 0; i++)
                    if (mx->http[i].fd < 0)
                        slot = i;
                /* all slots taken: the oldest connection that has not finished its request
                   makes room, so idle connections can never lock scrapers out */
                int free_slot = slot >= 0;
                for (int i = 0; i < CLIENTS && !free_slot; i++)
                    if (mx->http[i].resp == NULL &&
                        (slot < 0 || mx->http[i].started_ns < mx->http[slot].started_ns))
                        slot = i;
                if (slot < 0) {
                    close(fd); /* every slot is busy writing a response */
                    continue;
                }
                if (mx->http[slot].fd >= 0)
                    http_close(&mx->http[slot]);
                memset(&mx->http[slot], 0, sizeof mx->http[slot]);
                mx->http[slot].fd = fd;
                mx->http[slot].started_ns = now;
            }
            continue;
        }
        for (int i = 0; i < CLIENTS; i++) {
            http_client *h = &mx->http[i];
            if (h->fd < 0 || h->fd != items[k].fd || !items[k].revents)
                continue;
            if (h->resp == NULL) {
                ssize_t r = read(h->fd, h->req + h->req_len, sizeof h->req - 1 - h->req_len);
                if (r <= 0) {
                    if (r == 0 || (errno != EAGAIN && errno != EINTR))
                        http_close(h);
                    continue;
                }
                h->req_len += (size_t)r;
                h->req[h->req_len] = '\0';
                int complete =
                    strstr(h->req, "\r\n\r\n") != NULL || strstr(h->req, "\n\n") != NULL;
                if (complete || h->req_len == sizeof h->req - 1)
                    respond(s, h, complete);
            } else {
                ssize_t w = write(h->fd, h->resp + h->resp_at, h->resp_len - h->resp_at);
                if (w < 0 && (errno == EAGAIN || errno == EINTR))
                    continue;
                if (w <= 0) {
                    http_close(h);
                    continue;
                }
                h->resp_at += (size_t)w;
                if (h->resp_at == h->resp_len)
                    http_close(h);
            }
        }
    }
    for (int i = 0; i < CLIENTS; i++)
        if (mx->http[i].fd >= 0 && now - mx->http[i].started_ns > HTTP_TIMEOUT_NS)
            http_close(&mx->http[i]); /* a stuck client does not hold a slot forever */
}
