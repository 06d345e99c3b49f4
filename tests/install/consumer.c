/* consumer.c - a program outside the tree, built against the installed library
 * through pkg-config: proves the install ships a usable header, library and .pc. */
#include <fp4moe.h>
#include <stdio.h>

int main(void)
{
    fm_format f;
    if (fm_format_parse("nvfp4", &f) != FM_OK) return 1;
    const fm_format_traits *t = fm_format_traits_get(f);
    if (!t || t->block != 16) return 1;
    /* a status with its message and a detail string from a failing call */
    fm_status s = fm_format_parse("int3", &f);
    printf("fp4moe %s: %s (%s)\n", fm_version(), fm_status_name(s), fm_last_error());
    return s == FM_ERR_FORMAT ? 0 : 1;
}
