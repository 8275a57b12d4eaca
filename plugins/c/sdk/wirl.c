/* The C helper's text functions and the glue both versions' exports share (the generated
 * bindings, reward_plugin.h, name the WIT types alike in 0.1.0 and 0.2.0). The exports are
 * in wirl_v0_1.c and wirl_v0_2.c; scripts/build-plugins compiles the one the plugin's world
 * line names. */
#include "wirl.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reward_plugin.h"
#include "wirl_glue.h"
#include "wirl_unicode.h"

/* ---- glue shared by both versions' exports (wirl_glue.h) ----------------------------- */

wirl_str wirl__from_wit(const reward_plugin_string_t *s) {
    wirl_str out = {(const char *)s->ptr, s->len};
    return out;
}

void wirl__copy_string(reward_plugin_string_t *to, const char *text) {
    reward_plugin_string_dup(to, text ? text : "");
}

static void fill_score(const wirl_score *from, wirl_rl_types_score_t *to) {
    to->reward = from->reward;
    to->parts.len = from->n_parts;
    to->parts.ptr = from->n_parts ? calloc(from->n_parts, sizeof(*to->parts.ptr)) : NULL;
    for (size_t i = 0; i < from->n_parts; i++) {
        wirl__copy_string(&to->parts.ptr[i].f0, from->parts[i].name);
        to->parts.ptr[i].f1 = from->parts[i].value;
    }
    to->note.is_some = from->note != NULL;
    if (from->note) wirl__copy_string(&to->note.val, from->note);
}

wirl_task wirl__task_of(const wirl_rl_types_task_t *t) {
    wirl_task task;
    memset(&task, 0, sizeof task);
    task.id = wirl__from_wit(&t->id);
    task.has_answer = t->answer.is_some;
    if (t->answer.is_some) task.answer = wirl__from_wit(&t->answer.val);
    task.has_metadata = t->metadata.is_some;
    if (t->metadata.is_some) task.metadata = wirl__from_wit(&t->metadata.val);
    wirl_message *messages = t->messages.len ? calloc(t->messages.len, sizeof(*messages)) : NULL;
    for (size_t i = 0; i < t->messages.len; i++) {
        messages[i].role = wirl__from_wit(&t->messages.ptr[i].role);
        messages[i].content = wirl__from_wit(&t->messages.ptr[i].content);
    }
    task.messages = messages;
    task.n_messages = t->messages.len;
    return task;
}

void wirl__task_release(wirl_task *task) {
    free((void *)task->messages);
    task->messages = NULL;
}

void wirl__put_result(bool ok, wirl_score *score, char *error, exports_wirl_rl_reward_result_score_string_t *out) {
    out->is_err = !ok;
    if (ok) {
        fill_score(score, &out->val.ok);
    } else {
        wirl__copy_string(&out->val.err, error ? error : "the plugin gave no reason");
    }
    free(score->note);
    score->note = NULL;
    free(error);
}

/* Weak here: a 0.2.0 plugin may define wirl_reward_group alone (wirl_v0_2.c checks which
 * it has); 0.1.0's exports refer to wirl_reward strongly, so a 0.1.0 plugin without it does
 * not link. */
__attribute__((weak)) bool wirl_reward(const wirl_task *task, wirl_str completion, wirl_score *score, char **error);

bool wirl__score_one(const wirl_task *task, wirl_str completion, exports_wirl_rl_reward_result_score_string_t *out) {
    wirl_score score;
    memset(&score, 0, sizeof score);
    char *error = NULL;
    bool scored = wirl_reward(task, completion, &score, &error);
    wirl__put_result(scored, &score, error, out);
    return scored;
}

void wirl_part_add(wirl_score *score, const char *name, float value) {
    if (score->n_parts < WIRL_MAX_PARTS) {
        score->parts[score->n_parts].name = name;
        score->parts[score->n_parts].value = value;
        score->n_parts++;
    }
}

char *wirl_printf(const char *format, ...) {
    va_list args;
    va_start(args, format);
    int n = vsnprintf(NULL, 0, format, args);
    va_end(args);
    char *out = malloc(n > 0 ? (size_t)n + 1 : 1);
    va_start(args, format);
    vsnprintf(out, n > 0 ? (size_t)n + 1 : 1, format, args);
    va_end(args);
    return out;
}

bool wirl_config_number(const char *key, double fallback, double *out, char **error) {
    reward_plugin_string_t k, value;
    reward_plugin_string_set(&k, key);
    if (!wirl_rl_config_get(&k, &value)) {
        *out = fallback;
        return true;
    }
    char *text = wirl_printf("%.*s", (int)value.len, (const char *)value.ptr);
    char *end = NULL;
    *out = strtod(text, &end);
    bool ok = end != text && *end == '\0';
    if (!ok) *error = wirl_printf("config key `%s`: expected a number (value: %s)", key, text);
    free(text);
    reward_plugin_string_free(&value);
    return ok;
}

bool wirl_config_bool(const char *key, bool fallback, bool *out, char **error) {
    reward_plugin_string_t k, value;
    reward_plugin_string_set(&k, key);
    if (!wirl_rl_config_get(&k, &value)) {
        *out = fallback;
        return true;
    }
    wirl_str text = {(const char *)value.ptr, value.len};
    wirl_str yes = {"true", 4}, no = {"false", 5};
    bool ok = wirl_str_equal(text, yes) || wirl_str_equal(text, no);
    if (ok) {
        *out = wirl_str_equal(text, yes);
    } else {
        *error = wirl_printf("config key `%s`: expected true or false (value: %.*s)", key, WIRL_FMT(text));
    }
    reward_plugin_string_free(&value);
    return ok;
}

/* ---- text ---------------------------------------------------------------------------- */

/* Decode the character at s[i..]; its length in *n (1 for invalid bytes). */
static uint32_t decode(wirl_str s, size_t i, size_t *n) {
    const unsigned char *p = (const unsigned char *)s.ptr + i;
    size_t left = s.len - i;
    if (p[0] < 0x80 || left < 2) return *n = 1, p[0];
    if ((p[0] & 0xE0) == 0xC0) return *n = 2, ((uint32_t)(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    if ((p[0] & 0xF0) == 0xE0 && left >= 3)
        return *n = 3, ((uint32_t)(p[0] & 0x0F) << 12) | ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    if ((p[0] & 0xF8) == 0xF0 && left >= 4)
        return *n = 4, ((uint32_t)(p[0] & 0x07) << 18) | ((uint32_t)(p[1] & 0x3F) << 12) |
                           ((uint32_t)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
    return *n = 1, p[0];
}

/* The start of the character that ends at s[..end]. */
static size_t char_start_before(wirl_str s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && (((unsigned char)s.ptr[i]) & 0xC0) == 0x80 && end - i < 4) i--;
    return i;
}

static size_t encode(uint32_t c, char *out) {
    if (c < 0x80) return out[0] = (char)c, 1;
    if (c < 0x800) return out[0] = (char)(0xC0 | (c >> 6)), out[1] = (char)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | (c >> 12));
        out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (c >> 18));
    out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

static bool is_whitespace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

size_t wirl_whitespace_at(wirl_str s, size_t i) {
    size_t n;
    uint32_t c = decode(s, i, &n);
    return is_whitespace(c) ? n : 0;
}

wirl_str wirl_str_trim(wirl_str s) {
    size_t start = 0, end = s.len, n;
    while (start < end && (n = wirl_whitespace_at(s, start)) > 0) start += n;
    while (end > start) {
        size_t at = char_start_before(s, end);
        size_t len;
        if (!is_whitespace(decode(s, at, &len)) || at + len != end) break;
        end = at;
    }
    wirl_str out = {s.ptr + start, end - start};
    return out;
}

bool wirl_str_equal(wirl_str a, wirl_str b) {
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

bool wirl_str_contains(wirl_str haystack, wirl_str needle) {
    if (needle.len == 0) return true;
    for (size_t i = 0; i + needle.len <= haystack.len; i++)
        if (memcmp(haystack.ptr + i, needle.ptr, needle.len) == 0) return true;
    return false;
}

wirl_str wirl_str_prefix_chars(wirl_str s, size_t max_chars) {
    size_t i = 0, chars = 0, n;
    while (i < s.len && chars < max_chars) {
        decode(s, i, &n);
        i += n;
        chars++;
    }
    wirl_str out = {s.ptr, i};
    return out;
}

static bool in_ranges(const uint32_t (*table)[2], size_t count, uint32_t c) {
    size_t lo = 0, hi = count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < table[mid][0]) hi = mid;
        else if (c > table[mid][1]) lo = mid + 1;
        else return true;
    }
    return false;
}

#define COUNT(t) (sizeof(t) / sizeof((t)[0]))

static uint32_t lower_of(uint32_t c) {
    size_t lo = 0, hi = COUNT(WIRL_LOWER);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < WIRL_LOWER[mid][0]) hi = mid;
        else if (c > WIRL_LOWER[mid][0]) lo = mid + 1;
        else return WIRL_LOWER[mid][1];
    }
    return c;
}

static bool cased(uint32_t c) { return in_ranges(WIRL_CASED, COUNT(WIRL_CASED), c); }
static bool case_ignorable(uint32_t c) { return in_ranges(WIRL_CASE_IGNORABLE, COUNT(WIRL_CASE_IGNORABLE), c); }

/* Rust's rule: Σ is ς when a cased letter precedes it (case-ignorable ones skipped) and none
 * follows it. */
static bool final_sigma(wirl_str s, size_t at, size_t len) {
    bool before = false, after = false;
    size_t i = at, n;
    while (i > 0) {
        i = char_start_before(s, i);
        uint32_t c = decode(s, i, &n);
        if (case_ignorable(c)) continue;
        before = cased(c);
        break;
    }
    for (i = at + len; i < s.len; i += n) {
        uint32_t c = decode(s, i, &n);
        if (case_ignorable(c)) continue;
        after = cased(c);
        break;
    }
    return before && !after;
}

char *wirl_lowercase(wirl_str s, size_t *len) {
    char *out = malloc(s.len * 3 / 2 + 4); /* İ (2 bytes) becomes 3 bytes; nothing grows more */
    size_t o = 0, n;
    for (size_t i = 0; i < s.len; i += n) {
        uint32_t c = decode(s, i, &n);
        if (c == 0x130) {
            o += encode('i', out + o);
            o += encode(0x307, out + o);
        } else if (c == 0x3A3) {
            o += encode(final_sigma(s, i, n) ? 0x3C2 : 0x3C3, out + o);
        } else if (n == 1 && c >= 0x80) {
            out[o++] = s.ptr[i]; /* an invalid byte passes through */
        } else {
            o += encode(lower_of(c), out + o);
        }
    }
    out[o] = '\0';
    *len = o;
    return out;
}
