// wirl-world: reward-plugin
/* `math-answer` in C: is the model's final answer to a math task right?
 *
 * The same rules and scores as plugins/rust/math-answer (a test holds every build of it to
 * identical scores): the final answer is the last `<answer>…</answer>` block, else the last
 * `\boxed{…}`, else the last number. It is right when it equals the task's answer as a number
 * (within `tolerance`) or, failing that, as normalised text. Parts: `format`, `correct`.
 * Config: `tolerance` (default 1e-6), `format_weight` (default 0). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "wirl.h"

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

static wirl_str slice(wirl_str s, size_t start, size_t end) {
    wirl_str out = {s.ptr + start, end - start};
    return out;
}

/* The start of the last `needle` that ends at or before `end`, or -1. */
static long rfind(wirl_str s, size_t end, const char *needle) {
    size_t n = strlen(needle);
    for (size_t i = end >= n ? end - n + 1 : 0; i-- > 0;)
        if (i + n <= end && memcmp(s.ptr + i, needle, n) == 0) return (long)i;
    return -1;
}

static bool last_tagged(wirl_str t, wirl_str *out) {
    long close = rfind(t, t.len, "</answer>");
    if (close < 0) return false;
    long open = rfind(t, (size_t)close, "<answer>");
    if (open < 0) return false;
    *out = slice(t, (size_t)open + 8, (size_t)close);
    return true;
}

static bool last_boxed(wirl_str t, wirl_str *out) {
    size_t search_end = t.len;
    long start;
    while ((start = rfind(t, search_end, "\\boxed{")) >= 0) {
        size_t body = (size_t)start + 7, depth = 1;
        for (size_t i = body; i < t.len; i++) {
            if (t.ptr[i] == '{') depth++;
            else if (t.ptr[i] == '}' && --depth == 0) {
                *out = slice(t, body, i);
                return true;
            }
        }
        search_end = (size_t)start;
    }
    return false;
}

static bool group_of_three(wirl_str t, size_t at) {
    return t.len >= at + 3 && is_digit(t.ptr[at]) && is_digit(t.ptr[at + 1]) && is_digit(t.ptr[at + 2]) &&
           (t.len == at + 3 || !is_digit(t.ptr[at + 3]));
}

static bool any_digit(wirl_str s) {
    for (size_t i = 0; i < s.len; i++)
        if (is_digit(s.ptr[i])) return true;
    return false;
}

static bool last_number(wirl_str t, wirl_str *out) {
    size_t end = t.len;
    while (end > 0) {
        size_t last = end;
        for (size_t i = end; i-- > 0;)
            if (is_digit(t.ptr[i])) {
                last = i;
                break;
            }
        if (last == end) return false;
        size_t start = last;
        bool seen_point = false;
        while (start > 0) {
            char prev = t.ptr[start - 1];
            if (is_digit(prev)) start--;
            else if (prev == '.' && !seen_point && start >= 2 && is_digit(t.ptr[start - 2])) {
                seen_point = true;
                start--;
            } else if (prev == ',' && start >= 2 && is_digit(t.ptr[start - 2]) && group_of_three(t, start)) start--;
            else break;
        }
        if (start > 0 && t.ptr[start - 1] == '-') start--;
        wirl_str candidate = slice(t, start, last + 1);
        if (any_digit(candidate)) {
            *out = candidate;
            return true;
        }
        end = start;
    }
    return false;
}

/* Rust's f64 grammar for finite numbers: [+-]?(d+.?d*|.d+)([eE][+-]?d+)? */
static bool number_grammar(const char *s, size_t n) {
    size_t i = 0, digits = 0;
    if (i < n && (s[i] == '+' || s[i] == '-')) i++;
    while (i < n && is_digit(s[i])) i++, digits++;
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && is_digit(s[i])) i++, digits++;
    }
    if (digits == 0) return false;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        size_t exponent = 0;
        while (i < n && is_digit(s[i])) i++, exponent++;
        if (exponent == 0) return false;
    }
    return i == n;
}

static bool plain_number(wirl_str text, double *value) {
    wirl_str t = wirl_str_trim(text);
    char *buf = malloc(t.len + 1);
    size_t n = 0;
    bool digit = false, letter = false;
    for (size_t i = 0; i < t.len; i++) {
        char c = t.ptr[i];
        if (c == ',') continue;
        digit |= is_digit(c);
        letter |= is_alpha(c) && c != 'e' && c != 'E';
        buf[n++] = c;
    }
    buf[n] = '\0';
    bool ok = digit && !letter && number_grammar(buf, n);
    if (ok) {
        *value = strtod(buf, NULL);
        ok = isfinite(*value);
    }
    free(buf);
    return ok;
}

static wirl_str trim_end_dots(wirl_str s) {
    while (s.len > 0 && s.ptr[s.len - 1] == '.') s.len--;
    return s;
}

static bool parse_number(wirl_str text, double *value) {
    wirl_str t = wirl_str_trim(trim_end_dots(wirl_str_trim(text)));
    if (t.len > 0 && t.ptr[0] == '$') t = slice(t, 1, t.len);
    t = wirl_str_trim(t);
    if (t.len > 0 && t.ptr[t.len - 1] == '%') t.len--;
    t = wirl_str_trim(t);
    if (t.len == 0) return false;
    const char *slash = memchr(t.ptr, '/', t.len);
    if (slash) {
        double num, den;
        size_t at = (size_t)(slash - t.ptr);
        if (!plain_number(slice(t, 0, at), &num) || !plain_number(slice(t, at + 1, t.len), &den) || den == 0.0)
            return false;
        *value = num / den;
        return true;
    }
    return plain_number(t, value);
}

/* `\text{` removed, then `$ { }`; trimmed, trailing dots dropped, whitespace runs made one
 * space, lowercased. malloc'd. */
static char *normalise(wirl_str text, size_t *len) {
    char *kept = malloc(text.len + 1);
    size_t n = 0;
    for (size_t i = 0; i < text.len;) {
        if (text.len - i >= 6 && memcmp(text.ptr + i, "\\text{", 6) == 0) {
            i += 6;
            continue;
        }
        char c = text.ptr[i++];
        if (c != '$' && c != '{' && c != '}') kept[n++] = c;
    }
    wirl_str t = trim_end_dots(wirl_str_trim((wirl_str){kept, n}));
    char *joined = malloc(t.len + 1);
    size_t j = 0;
    for (size_t i = 0; i < t.len;) {
        size_t ws = wirl_whitespace_at(t, i);
        if (ws > 0) {
            while (i < t.len && (ws = wirl_whitespace_at(t, i)) > 0) i += ws;
            joined[j++] = ' ';
        } else {
            joined[j++] = t.ptr[i++];
        }
    }
    if (j > 0 && joined[j - 1] == ' ') j--; /* trailing whitespace left by the dots */
    char *lower = wirl_lowercase((wirl_str){joined, j}, len);
    free(kept);
    free(joined);
    return lower;
}

static bool answers_match(wirl_str found, wirl_str expected, double tolerance) {
    double a, b;
    if (parse_number(found, &a) && parse_number(expected, &b)) return fabs(a - b) <= tolerance;
    size_t la, lb;
    char *na = normalise(found, &la), *nb = normalise(expected, &lb);
    bool equal = la == lb && memcmp(na, nb, la) == 0;
    free(na);
    free(nb);
    return equal;
}

bool wirl_reward(const wirl_task *task, wirl_str completion, wirl_score *score, char **error) {
    double tolerance, format_weight;
    if (!wirl_config_number("tolerance", 1e-6, &tolerance, error) ||
        !wirl_config_number("format_weight", 0.0, &format_weight, error))
        return false;
    if (!task->has_answer) {
        *error = wirl_printf("task %.*s has no answer to compare with", WIRL_FMT(task->id));
        return false;
    }
    wirl_str found;
    bool tagged = true;
    if (last_tagged(completion, &found) || last_boxed(completion, &found)) {
        found = wirl_str_trim(found);
    } else if (last_number(completion, &found)) {
        tagged = false;
    } else {
        score->reward = 0.0f;
        wirl_part_add(score, "format", 0.0f);
        wirl_part_add(score, "correct", 0.0f);
        score->note = wirl_printf("no answer found");
        return true;
    }
    float format = tagged ? 1.0f : 0.0f;
    float correct = answers_match(found, task->answer, tolerance) ? 1.0f : 0.0f;
    score->reward = correct + (float)format_weight * format;
    wirl_part_add(score, "format", format);
    wirl_part_add(score, "correct", correct);
    wirl_str shown = wirl_str_prefix_chars(found, 80);
    score->note = wirl_printf("answer: %.*s", WIRL_FMT(shown));
    return true;
}
