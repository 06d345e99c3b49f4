/* flags.c - one parser and one usage printer for every subcommand's flag table (flags.h). */
#include "flags.h"

#include <assert.h>
#include <string.h>
#include <strings.h>

#include "cli.h"

int fm_flags_index(const fm_flag_cmd *c, const char *name)
{
    for (size_t i = 0; i < c->n_flags; i++)
        if (!strcmp(c->flags[i].name, name)) return (int)i;
    return -1;
}

/* The row "--" + a (up to len) names: the exact name, else the only name it is a prefix of; -1 none or several. */
static int lookup(const fm_flag_cmd *c, const char *a, size_t len)
{
    int hit = -1, hits = 0;
    for (size_t i = 0; i < c->n_flags; i++) {
        const char *n = c->flags[i].name;
        if (strncmp(n, a, len)) continue;
        if (!n[len]) return (int)i;
        hit = (int)i, hits++;
    }
    return hits == 1 ? hit : -1;
}

static void choices_list(const fm_flag_choice *ch, FILE *f)
{
    for (int i = 0; ch[i].name; i++) fprintf(f, "%s%s", i == 0 ? "" : ch[i + 1].name ? ", " : " or ", ch[i].name);
}

/* One value into its field: FM_FLAGS_GO, or the exit code (message printed). */
static int set_value(const fm_flag_cmd *c, const fm_flag *fl, const char *val, char *opts)
{
    char  flag[64];
    void *field = opts + fl->off;
    long  lv;
    snprintf(flag, sizeof flag, "--%s", fl->name);
    switch (fl->kind) {
    case FM_FLAG_INT:
        if (!fm_cli_int(c->cmd, flag, val, (long)fl->lo, (long)fl->hi, &lv)) return FM_EXIT_USAGE;
        *(int *)field = (int)lv;
        return FM_FLAGS_GO;
    case FM_FLAG_DOUBLE:
        return fm_cli_double(c->cmd, flag, val, fl->lo, fl->hi, (double *)field) ? FM_FLAGS_GO : FM_EXIT_USAGE;
    case FM_FLAG_FILE:
        if (!*val) {
            fprintf(stderr, "fp4moe %s: %s expects a file name\n", c->cmd, flag);
            return FM_EXIT_USAGE;
        }
        /* fall through */
    case FM_FLAG_STRING: *(const char **)field = val; return FM_FLAGS_GO;
    case FM_FLAG_CHOICE:
        for (const fm_flag_choice *ch = fl->choices; ch->name; ch++)
            if (!(fl->nocase ? strcasecmp : strcmp)(val, ch->name)) {
                *(int *)field = ch->value;
                return FM_FLAGS_GO;
            }
        fprintf(stderr, "fp4moe %s: %s expects ", c->cmd, flag);
        choices_list(fl->choices, stderr);
        fprintf(stderr, ", got '%s'\n", val);
        return FM_EXIT_USAGE;
    case FM_FLAG_CUSTOM: return fl->parse(c->cmd, flag, val, field);
    case FM_FLAG_SWITCH:
    case FM_FLAG_HELP: break;
    }
    return FM_EXIT_USAGE;
}

static int say(const fm_flag_cmd *c, const char *const msg[2], const char *a)
{
    fprintf(stderr, "fp4moe %s: %s%s%s\n", c->cmd, msg[0], a, msg[1]);
    return FM_EXIT_USAGE;
}

static int unknown(const fm_flag_cmd *c, const char *a)
{
    say(c, c->unknown, a);
    if (c->usage_on_unknown) fm_flags_usage(c, stderr);
    return FM_EXIT_USAGE;
}

/* The row argv[i] names, with its value in *val (NULL: none there); -1 unknown. */
static int find(const fm_flag_cmd *c, int argc, char **argv, int *i, const char **val)
{
    const char *a = argv[*i];
    if (c->short_help && !strcmp(a, "-h")) a = "--help";
    if (c->strict) {
        int k = strncmp(a, "--", 2) ? -1 : fm_flags_index(c, a + 2);
        *val = *i + 1 < argc ? argv[*i + 1] : NULL;
        if (k >= 0 && *val && c->flags[k].kind != FM_FLAG_SWITCH && c->flags[k].kind != FM_FLAG_HELP) ++*i;
        return k;
    }
    if (a[1] != '-') return -1; /* short flags: none but -h */
    const char *eq = strchr(a + 2, '=');
    int         k = lookup(c, a + 2, eq ? (size_t)(eq - a - 2) : strlen(a + 2));
    if (k < 0) return -1;
    if (c->flags[k].kind == FM_FLAG_SWITCH || c->flags[k].kind == FM_FLAG_HELP) {
        *val = eq; /* a value given to a flag that takes none: refused by the caller */
        return eq ? -1 : k;
    }
    *val = eq ? eq + 1 : *i + 1 < argc ? argv[++*i] : NULL;
    return k;
}

int fm_flags_parse(const fm_flag_cmd *c, int argc, char **argv, void *opts, fm_flags_result *r)
{
    assert(c->n_flags <= FM_FLAGS_MAX); /* r->seen has a slot per row */
    memset(r, 0, sizeof *r);
    int only_args = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        if (!c->strict && (only_args || a[0] != '-' || !a[1])) { /* a word, "-", or anything after "--" */
            if (r->n_args < FM_FLAGS_MAX_ARGS) r->args[r->n_args] = a;
            r->n_args++;
            continue;
        }
        if (!c->strict && !strcmp(a, "--")) {
            only_args = 1;
            continue;
        }
        int k = find(c, argc, argv, &i, &val);
        if (k >= 0 && c->flags[k].kind == FM_FLAG_HELP) {
            fm_flags_usage(c, stdout);
            return FM_EXIT_OK;
        }
        if (k >= 0 && c->flags[k].kind == FM_FLAG_SWITCH) {
            r->seen[k] = i;
            *(int *)((char *)opts + c->flags[k].off) = 1;
            continue;
        }
        if (!val && c->strict && c->missing[0] && (k >= 0 || !c->missing_known_only)) return say(c, c->missing, a);
        if (val && !*val && c->empty_post) { /* '' is not "not given" (a script's empty variable) */
            fprintf(stderr, "fp4moe %s: %s%s\n", c->cmd, a, c->empty_post);
            return FM_EXIT_USAGE;
        }
        if (k < 0 || !val) return unknown(c, a);
        r->seen[k] = i;
        int rc = set_value(c, &c->flags[k], val, opts);
        if (rc != FM_FLAGS_GO) return rc;
    }
    return FM_FLAGS_GO;
}

void fm_flags_usage(const fm_flag_cmd *c, FILE *f)
{
    for (int i = 0; i < 4 && c->head[i]; i++) fputs(c->head[i], f);
    if (c->more) c->more(f);
    for (size_t i = 0; i < c->n_flags; i++) {
        const fm_flag *fl = &c->flags[i];
        if (!fl->help) continue;
        char name[64];
        if (fl->shown) snprintf(name, sizeof name, "%s", fl->shown);
        else snprintf(name, sizeof name, "--%s%s%s", fl->name, fl->arg ? " " : "", fl->arg ? fl->arg : "");
        fprintf(f, "  %-*s %s", c->col, name, (int)strlen(name) > c->col ? " " : "");
        for (const char *l = fl->help;;) { /* the help's lines, the later ones indented under the first */
            size_t n = strcspn(l, "\n");
            fprintf(f, "%.*s\n", (int)n, l);
            if (!l[n] || !l[n + 1]) break;
            l += n + 1;
            fprintf(f, "%*s", c->col + 3, "");
        }
    }
    for (int i = 0; i < 4 && c->tail[i]; i++) fputs(c->tail[i], f);
}
