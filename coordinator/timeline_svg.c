/*
 * coordinator/timeline_svg: draws a job's timeline (timeline_int.h) as one self-contained
 * SVG document: no script, no external font or style, so that a browser, an image viewer
 * or a README shows it as it is. Every drawn element carries what it stands for as
 * attributes: rows (class "row": data-worker, data-host, data-device), segments (class
 * "seg" and online/offline/bubble/failed: data-worker, data-gen, data-role, data-job,
 * data-t0, data-t1 in ms from the timeline's start) and marks (class "mark" and
 * resize/recovery/rollback/abort/checkpoint/failure/stall: data-gen, data-t0, data-t1,
 * data-ms, data-step, data-worker).
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "coordinator/timeline_int.h"

#define WIDTH    1200 /* px */
#define LABEL_W  230  /* px: the row labels */
#define RIGHT_W  30   /* px */
#define MARKS_Y  62   /* px: first line of the mark labels */
#define ROWS_Y   116  /* px: the first row */
#define ROW_H    22   /* px */
#define HOST_GAP 10   /* px between two hosts' rows */

static const char *const gen_colors[] = {"#4e79a7", "#59a14f", "#76b7b2", "#9c755f",
                                         "#edc948", "#b07aa1", "#86bcb6", "#bab0ac"};
#define OFFLINE_COLOR "#f28e2b"
#define BUBBLE_COLOR  "#7b3294"
#define FAILED_COLOR  "#d62728"

/* s with XML's special characters escaped. */
static void xml_text(FILE *out, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&':
            fputs("&amp;", out);
            break;
        case '<':
            fputs("&lt;", out);
            break;
        case '>':
            fputs("&gt;", out);
            break;
        case '"':
            fputs("&quot;", out);
            break;
        default:
            if ((unsigned char)*s >= 0x20 && (unsigned char)*s < 0x7f)
                fputc(*s, out);
            else
                fputc('?', out);
        }
    }
}

static double x_of(const tide_timeline_t *t, int64_t ms)
{
    double span = (double)(t->end - t->start);
    return LABEL_W + (double)(ms - t->start) * (WIDTH - LABEL_W - RIGHT_W) / span;
}

/* y of row i's top: rows of one host together, a gap before each new host. */
static double y_of(const tide_timeline_t *t, size_t i)
{
    double y = ROWS_Y;
    for (size_t k = 1; k <= i; k++)
        y += ROW_H + (strcmp(t->rows[k].host, t->rows[k - 1].host) != 0 ? HOST_GAP : 0);
    return y;
}

static size_t count_marks(const tide_timeline_t *t, int kind)
{
    size_t n = 0;
    for (size_t i = 0; i < t->n_marks; i++)
        n += t->marks[i].kind == kind;
    return n;
}

static void header(const tide_timeline_t *t, FILE *out, double height)
{
    fprintf(out,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%.0f\" "
            "viewBox=\"0 0 %d %.0f\" font-family=\"DejaVu Sans, Arial, sans-serif\" "
            "font-size=\"11\" data-job=\"",
            WIDTH, height, WIDTH, height);
    xml_text(out, t->job);
    fprintf(out, "\" data-start-ms=\"%lld\" data-end-ms=\"%lld\">\n", (long long)t->start,
            (long long)t->end);
    fputs("<title>tide timeline of job ", out);
    xml_text(out, t->job);
    fputs("</title>\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n", out);
    fputs("<text class=\"title\" x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">job ",
          out);
    xml_text(out, t->job);
    fprintf(out,
            ": %zu GPUs, %.1f s; %zu resizes, %zu recoveries, %zu rollbacks, %zu checkpoints, "
            "%zu failures</text>\n",
            t->n_rows, (double)(t->end - t->start) / 1000.0, count_marks(t, MK_RESIZE),
            count_marks(t, MK_RECOVERY), count_marks(t, MK_ROLLBACK), count_marks(t, MK_CHECKPOINT),
            count_marks(t, MK_FAILURE));
    static const char *const names[] = {"online (color: generation)", "offline job (backfill)",
                                        "offline task in pipeline bubbles", "failed"};
    static const char *const colors[] = {"#4e79a7", OFFLINE_COLOR, BUBBLE_COLOR, FAILED_COLOR};
    fputs("<g class=\"legend\">\n", out);
    for (int i = 0; i < 4; i++)
        fprintf(out,
                "<rect x=\"%d\" y=\"32\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                "<text x=\"%d\" y=\"42\">%s</text>\n",
                10 + i * 220, colors[i], 26 + i * 220, names[i]);
    fputs("<rect x=\"890\" y=\"32\" width=\"12\" height=\"12\" fill=\"#000000\" "
          "fill-opacity=\"0.15\"/><text x=\"906\" y=\"42\">reconfiguration (downtime)</text>\n"
          "</g>\n",
          out);
}

/* The time axis under the rows: a tick every 1, 2 or 5 x 10^k seconds. */
static void axis(const tide_timeline_t *t, FILE *out, double y)
{
    double span_s = (double)(t->end - t->start) / 1000.0;
    double raw = span_s / 8.0, step = 1e-3;
    while (step * 10 <= raw)
        step *= 10;
    step = raw >= 5 * step ? 5 * step : raw >= 2 * step ? 2 * step : step;
    fprintf(out,
            "<g class=\"axis\">\n<line x1=\"%d\" y1=\"%.0f\" x2=\"%d\" y2=\"%.0f\" "
            "stroke=\"#333333\"/>\n",
            LABEL_W, y, WIDTH - RIGHT_W, y);
    for (double s = 0; s <= span_s + 1e-9; s += step) {
        double x = x_of(t, t->start + (int64_t)llround(s * 1000.0));
        fprintf(out,
                "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#333333\"/>"
                "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%g s</text>\n",
                x, y, x, y + 4, x, y + 16, s);
    }
    fputs("</g>\n", out);
}

static void segment(const tide_timeline_t *t, FILE *out, const seg_t *s, double y)
{
    double x0 = x_of(t, s->t0), x1 = x_of(t, s->t1);
    double w = x1 - x0 < 1 ? 1 : x1 - x0;
    /* bubble work shares its GPU with the online job: a band along the row's bottom */
    double top = s->kind == SEG_BUBBLE ? y + ROW_H - 8 : y + 2;
    double h = s->kind == SEG_BUBBLE ? 6 : ROW_H - 4;
    const char *fill = s->kind == SEG_ONLINE    ? gen_colors[s->gen % 8]
                       : s->kind == SEG_OFFLINE ? OFFLINE_COLOR
                       : s->kind == SEG_BUBBLE  ? BUBBLE_COLOR
                                                : FAILED_COLOR;
    fprintf(out, "<rect class=\"seg %s\" data-worker=\"%d\" data-t0=\"%lld\" data-t1=\"%lld\"",
            tide__timeline_seg_class[s->kind], t->rows[s->row].worker,
            (long long)(s->t0 - t->start), (long long)(s->t1 - t->start));
    if (s->kind == SEG_ONLINE)
        fprintf(out, " data-gen=\"%llu\" data-role=\"p%d d%d t%d\"", (unsigned long long)s->gen,
                s->p, s->d, s->t);
    if (s->job[0]) {
        fputs(" data-job=\"", out);
        xml_text(out, s->job);
        fputc('"', out);
    }
    fprintf(out, " x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>", x0,
            top, w, h, fill);
    if (s->kind == SEG_ONLINE)
        fprintf(out, "generation %llu: pipeline stage %d, data rank %d, tensor rank %d",
                (unsigned long long)s->gen, s->p, s->d, s->t);
    else if (s->kind == SEG_FAILED)
        fputs("failed", out);
    else
        xml_text(out, s->job);
    fprintf(out, " (%.1f s)</title></rect>\n", (double)(s->t1 - s->t0) / 1000.0);
    if (s->kind == SEG_ONLINE && w > 70)
        fprintf(out,
                "<text x=\"%.1f\" y=\"%.1f\" fill=\"#ffffff\" font-size=\"10\">g%llu p%d d%d "
                "t%d</text>\n",
                x0 + 3, y + 15, (unsigned long long)s->gen, s->p, s->d, s->t);
}

static void rows(const tide_timeline_t *t, FILE *out)
{
    for (size_t i = 0; i < t->n_rows; i++) {
        const row_t *r = &t->rows[i];
        double y = y_of(t, i);
        fprintf(out, "<g class=\"row\" data-worker=\"%d\" data-host=\"", r->worker);
        xml_text(out, r->host);
        fprintf(out,
                "\" data-device=\"%d\">\n<rect x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%d\" "
                "fill=\"%s\"/>\n<text x=\"8\" y=\"%.1f\">",
                r->device, LABEL_W, y + 1, WIDTH - LABEL_W - RIGHT_W, ROW_H - 2,
                i % 2 ? "#f4f4f4" : "#ebebeb", y + 15);
        xml_text(out, r->host[0] ? r->host : "?");
        if (r->device >= 0)
            fprintf(out, " GPU %d", r->device);
        fprintf(out, " (worker %d)</text>\n", r->worker);
        for (int pass = 0; pass < 2; pass++) /* bubble bands over the online segments */
            for (size_t k = 0; k < t->n_segs; k++)
                if (t->segs[k].row == i && (t->segs[k].kind == SEG_BUBBLE) == pass)
                    segment(t, out, &t->segs[k], y);
        fputs("</g>\n", out);
    }
}

/* A reconfiguration's band over every row, and its label above them. */
static void band_mark(const tide_timeline_t *t, FILE *out, const mark_t *m, size_t nth,
                      double bottom)
{
    double x0 = x_of(t, m->t0), x1 = x_of(t, m->t1);
    double w = x1 - x0 < 2 ? 2 : x1 - x0;
    double ly = MARKS_Y + (double)(nth % 3) * 14;
    const char *stroke = m->kind == MK_RESIZE ? "#222222" : FAILED_COLOR;
    fprintf(out,
            "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%.1f\" fill=\"#000000\" "
            "fill-opacity=\"0.15\"/>\n<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
            "stroke=\"%s\" stroke-dasharray=\"%s\"/>\n<text x=\"%.1f\" y=\"%.1f\" "
            "text-anchor=\"%s\" fill=\"%s\">",
            x1 - w, ROWS_Y - 2, w, bottom - ROWS_Y + 2, x1, ly + 3, x1, bottom, stroke,
            m->kind == MK_ABORT ? "2,3" : "4,2", x1 + 2, ly, x1 > WIDTH - 260 ? "end" : "start",
            stroke);
    xml_text(out, m->text);
    fputs("</text>\n", out);
}

static void marks(const tide_timeline_t *t, FILE *out, double bottom)
{
    size_t nth = 0;
    for (size_t i = 0; i < t->n_marks; i++) {
        const mark_t *m = &t->marks[i];
        fprintf(out,
                "<g class=\"mark %s\" data-gen=\"%llu\" data-t0=\"%lld\" data-t1=\"%lld\" "
                "data-ms=\"%.1f\" data-step=\"%lld\" data-worker=\"%d\">\n<title>",
                tide__timeline_mark_class[m->kind], (unsigned long long)m->gen,
                (long long)(m->t0 - t->start), (long long)(m->t1 - t->start), m->ms,
                (long long)m->step, m->worker);
        xml_text(out, m->text);
        fputs("</title>\n", out);
        double x = x_of(t, m->t1);
        if (m->kind <= MK_ABORT) {
            band_mark(t, out, m, nth++, bottom);
        } else if (m->kind == MK_FAILURE) {
            long r = -1;
            for (size_t k = 0; k < t->n_rows; k++)
                if (t->rows[k].worker == m->worker)
                    r = (long)k;
            double y = r >= 0 ? y_of(t, (size_t)r) + ROW_H / 2.0 : ROWS_Y - 8;
            fprintf(out,
                    "<path d=\"M%.1f %.1f l8 8 m0 -8 l-8 8\" stroke=\"%s\" stroke-width=\"3\"/>\n",
                    x - 4, y - 4, FAILED_COLOR);
        } else { /* checkpoint, stall: a triangle above the rows */
            fprintf(out, "<path d=\"M%.1f %d l-5 -8 h10 z\" fill=\"%s\"/>\n", x, ROWS_Y - 2,
                    m->kind == MK_CHECKPOINT ? "#1f77b4" : FAILED_COLOR);
        }
        fputs("</g>\n", out);
    }
}

tide_status tide_timeline_svg(const tide_timeline_t *t, FILE *out)
{
    double bottom = t->n_rows ? y_of(t, t->n_rows - 1) + ROW_H : ROWS_Y;
    header(t, out, bottom + 40);
    rows(t, out);
    marks(t, out, bottom);
    axis(t, out, bottom + 8);
    fputs("</svg>\n", out);
    if (fflush(out) != 0 || ferror(out))
        return tide_errorf(TIDE_ERR_IO, "writing the timeline: %s", strerror(errno));
    return TIDE_OK;
}
