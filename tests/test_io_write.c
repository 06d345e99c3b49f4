/* test_io_write.c - every file fp4moe writes goes through fm_file_out (fm_file.h):
 * PATH is written only when absent or a regular file this process may write,
 * through an exclusive temporary renamed over it once every byte is written.
 *
 * Each hostile PATH (a symbolic link to a file, a dangling link, a FIFO, a
 * directory, a device node, a read-only file - refused for root too -, a path in
 * a missing folder) is tried with fm_npy_write and fm_safetensors_write (the
 * public writers) and with the helper itself: FM_ERR_IO naming PATH, PATH exactly
 * as it was (type, target, content), no temporary left in the folder, and never a
 * blocked open() (a FIFO). A write that fails part-way (EFBIG from RLIMIT_FSIZE,
 * in a forked child with SIGXFSZ ignored: a disk that fills up, honestly
 * simulated) leaves PATH's old content and no temporary.
 *
 * The device case uses a node made with mknod in the test's folder (1:7, what
 * /dev/full is) when the test runs as root: testing the real /dev/full would
 * replace it, as root, should the writer ever regress. Without root, /dev/null
 * is tried instead (its folder is not ours to write, so nothing can be lost).
 */
#define _GNU_SOURCE
#include "testutil.h"

#include "fm_file.h"
#include "fm_internal.h" /* fm_fail */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[256];

static void path_of(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", g_dir, name); }

static void put(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(chmod(path, mode), 0);
}

/* Content of a regular file (not following a link), or "" */
static const char *content(const char *path)
{
    static char buf[256];
    buf[0] = 0;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return buf;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    buf[n > 0 ? n : 0] = 0;
    return buf;
}

/* No "*.tmp" file left in the folder (a temporary of a failed write). */
static void assert_no_temporaries(void)
{
    DIR *d = opendir(g_dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 4 && !strcmp(e->d_name + l - 4, ".tmp")) fail_msg("temporary left behind: %s/%s", g_dir, e->d_name);
    }
    closedir(d);
}

static void expect_refused(const char *what, fm_status got, const char *path, const char *needle)
{
    if (got != FM_ERR_IO || !strstr(fm_last_error(), path) || (needle && !strstr(fm_last_error(), needle)))
        fail_msg("%s: got %s '%s', want FM_ERR_IO naming %s with '%s'", what, fm_status_name(got), fm_last_error(),
                 path, needle ? needle : "");
    assert_no_temporaries();
}

static const float k_data[6] = {1, 2, 3, 4, 5, 6};

/* All three writers at `path`, each refused with `needle` in the message. */
static void try_all(const char *path, const char *needle)
{
    const int64_t shape[2] = {2, 3};
    expect_refused("fm_npy_write", fm_npy_write(path, FM_DTYPE_F32, 2, shape, k_data), path, needle);
    fm_st_write_item it = {.name = "t", .dtype = FM_DTYPE_F32, .ndim = 2, .shape = {2, 3}, .data = k_data};
    expect_refused("fm_safetensors_write", fm_safetensors_write(path, &it, 1, NULL, NULL, 0), path, needle);
    fm_file_out o;
    expect_refused("fm_file_out_begin", fm_file_out_begin(path, &o), path, needle);
}

static void test_absent_and_regular(void **state)
{
    (void)state;
    char p[400];
    path_of(p, sizeof p, "y.npy");
    const int64_t shape[2] = {2, 3};
    assert_int_equal(fm_npy_write(p, FM_DTYPE_F32, 2, shape, k_data), FM_OK);
    fm_npy a;
    assert_int_equal(fm_npy_read(p, &a), FM_OK);
    assert_memory_equal(a.data, k_data, sizeof k_data);
    fm_npy_free(&a);
    /* an existing writable file is replaced */
    const float two[2] = {7, 8};
    const int64_t s1[1] = {2};
    assert_int_equal(fm_npy_write(p, FM_DTYPE_F32, 1, s1, two), FM_OK);
    assert_int_equal(fm_npy_read(p, &a), FM_OK);
    assert_int_equal(a.numel, 2);
    fm_npy_free(&a);
    /* the helper itself: bytes, commit, content */
    path_of(p, sizeof p, "plain.txt");
    put(p, "old", 0644);
    fm_file_out o;
    assert_int_equal(fm_file_out_begin(p, &o), FM_OK);
    assert_int_equal(fm_file_out_write(&o, "new ", 4), FM_OK);
    assert_int_equal(fm_file_out_write(&o, "text", 4), FM_OK);
    assert_string_equal(content(p), "old"); /* untouched until commit */
    assert_int_equal(fm_file_out_commit(&o), FM_OK);
    assert_string_equal(content(p), "new text");
    /* abort: PATH as it was */
    assert_int_equal(fm_file_out_begin(p, &o), FM_OK);
    assert_int_equal(fm_file_out_write(&o, "lost", 4), FM_OK);
    fm_file_out_abort(&o);
    fm_file_out_abort(&o); /* harmless twice */
    assert_string_equal(content(p), "new text");
    assert_no_temporaries();
    unlink(p);
    path_of(p, sizeof p, "y.npy");
    unlink(p);
}

static void test_symlinks(void **state)
{
    (void)state;
    char target[400], link[400], dangling[400], gone[400];
    path_of(target, sizeof target, "target.txt");
    path_of(link, sizeof link, "link.npy");
    path_of(dangling, sizeof dangling, "dangling.npy");
    path_of(gone, sizeof gone, "nowhere.txt");
    put(target, "keep", 0644);
    assert_int_equal(symlink(target, link), 0);
    assert_int_equal(symlink(gone, dangling), 0);
    try_all(link, "symbolic link");
    try_all(dangling, "symbolic link");
    struct stat sb;
    assert_int_equal(lstat(link, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode)); /* still the link */
    assert_string_equal(content(target), "keep");
    assert_int_equal(lstat(dangling, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    assert_int_not_equal(lstat(gone, &sb), 0); /* nothing created through the dangling link */
    unlink(link);
    unlink(dangling);
    unlink(target);
}

static void test_fifo_directory(void **state)
{
    (void)state;
    char fifo[400], dir[400];
    path_of(fifo, sizeof fifo, "fifo.npy");
    path_of(dir, sizeof dir, "dir.npy");
    assert_int_equal(mkfifo(fifo, 0666), 0);
    assert_int_equal(mkdir(dir, 0777), 0);
    try_all(fifo, "FIFO");
    try_all(dir, "directory");
    struct stat sb;
    assert_int_equal(lstat(fifo, &sb), 0);
    assert_true(S_ISFIFO(sb.st_mode));
    assert_int_equal(lstat(dir, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));
    unlink(fifo);
    rmdir(dir);
}

static void test_device(void **state)
{
    (void)state;
    char dev[400];
    path_of(dev, sizeof dev, "full.npy");
    if (mknod(dev, S_IFCHR | 0666, makedev(1, 7)) == 0) {
        try_all(dev, "character device");
        struct stat sb;
        assert_int_equal(lstat(dev, &sb), 0);
        assert_true(S_ISCHR(sb.st_mode) && sb.st_rdev == makedev(1, 7));
        unlink(dev);
    } else {
        print_message("mknod not permitted (%s): trying /dev/null, whose folder is not ours\n", strerror(errno));
        struct stat sb;
        if (stat("/dev/null", &sb) == 0 && S_ISCHR(sb.st_mode)) {
            const int64_t shape[2] = {2, 3};
            fm_status s = fm_npy_write("/dev/null", FM_DTYPE_F32, 2, shape, k_data);
            if (s != FM_ERR_IO || !strstr(fm_last_error(), "character device"))
                fail_msg("/dev/null: got %s '%s'", fm_status_name(s), fm_last_error());
        }
    }
}

static void test_read_only(void **state)
{
    (void)state;
    char p[400];
    path_of(p, sizeof p, "ro.npy");
    put(p, "read-only", 0444);
    /* as root access(W_OK) says yes: the mode bits decide (fm_file.h) */
    try_all(p, "read-only");
    assert_string_equal(content(p), "read-only");
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0444);
    unlink(p);
}

static void test_missing_folder(void **state)
{
    (void)state;
    char p[400];
    path_of(p, sizeof p, "no/such/folder/y.npy");
    try_all(p, "No such file or directory");
    fm_file_out o;
    assert_int_equal(fm_file_out_begin("", &o), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_file_out_begin(NULL, &o), FM_ERR_INVALID_ARG);
}

/* A write that fails part-way: in a child, SIGXFSZ ignored and RLIMIT_FSIZE at
 * 4 KiB, so write() returns EFBIG past it (what a full disk does with ENOSPC).
 * The writer must report FM_ERR_IO naming PATH, remove its temporary, and
 * leave PATH's old content. Exit codes: 0 as wanted, 1.. what went wrong. */
static int child_write_too_big(const char *p, int which)
{
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {4096, 4096};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) return 10;
    static float big[16384]; /* 64 KiB */
    const int64_t shape[1] = {16384};
    fm_status s;
    if (which == 0) {
        s = fm_npy_write(p, FM_DTYPE_F32, 1, shape, big);
    } else if (which == 1) {
        fm_st_write_item it = {.name = "big", .dtype = FM_DTYPE_F32, .ndim = 1, .shape = {16384}, .data = big};
        s = fm_safetensors_write(p, &it, 1, NULL, NULL, 0);
    } else {
        fm_file_out o;
        if (fm_file_out_begin(p, &o) != FM_OK) return 11;
        s = fm_file_out_write(&o, big, sizeof big);
        if (s == FM_OK) s = fm_file_out_commit(&o);
        else {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", fm_last_error());
            if (fm_file_out_commit(&o) == FM_OK) return 12; /* a commit after a failed write must fail */
            fm_fail(s, "%s", msg);
        }
    }
    if (s != FM_ERR_IO) return 2;
    if (!strstr(fm_last_error(), p) || !strstr(fm_last_error(), strerror(EFBIG))) {
        fprintf(stderr, "message: %s\n", fm_last_error());
        return 3;
    }
    return 0;
}

static void test_write_error(void **state)
{
    (void)state;
    char p[400];
    path_of(p, sizeof p, "out.npy");
    for (int which = 0; which < 3; which++) {
        put(p, "previous output", 0644);
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) _exit(child_write_too_big(p, which));
        int st = 0;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fail_msg("writer %d under RLIMIT_FSIZE: child status %d (2: not FM_ERR_IO, 3: message)", which,
                     WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        assert_string_equal(content(p), "previous output");
        assert_no_temporaries();
        unlink(p);
        /* and when PATH was absent: still absent */
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) _exit(child_write_too_big(p, which));
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        struct stat sb;
        assert_int_not_equal(lstat(p, &sb), 0);
        assert_no_temporaries();
    }
}

static int setup(void **state)
{
    (void)state;
    const char *t = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/fm-write-XXXXXX", t && *t ? t : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return rmdir(g_dir); /* every test removes what it made: a leftover fails here */
}

/* The index is text JSON: no NUL byte (the first weight_map entry used to be preceded by
 * one, a 6-byte put of the 5-character "\n    ", which Python's json and HF tooling refuse;
 * cJSON skips it as whitespace, so our own reader never noticed). */
static void test_index_text(void **state)
{
    (void)state;
    char p[400];
    path_of(p, sizeof p, "model.safetensors.index.json");
    const char *names[2] = {"a.weight", "b.weight"}, *files[2] = {"m-1.safetensors", "m-2.safetensors"};
    assert_int_equal(fm_safetensors_write_index(p, names, files, 2, 42), FM_OK);
    int fd = open(p, O_RDONLY);
    assert_true(fd >= 0);
    char buf[512];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    assert_true(n > 0 && n < (ssize_t)sizeof buf);
    assert_null(memchr(buf, 0, (size_t)n));
    buf[n] = 0;
    assert_string_equal(buf, "{\n  \"metadata\": {\"total_size\": 42},\n  \"weight_map\": {\n    \"a.weight\": "
                             "\"m-1.safetensors\",\n    \"b.weight\": \"m-2.safetensors\"\n  }\n}\n");
    assert_int_equal(unlink(p), 0);
}

int main(void)
{
    alarm(60); /* a blocked open() of the FIFO is a failure, not a hang */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_absent_and_regular), cmocka_unit_test(test_symlinks),
        cmocka_unit_test(test_fifo_directory),     cmocka_unit_test(test_device),
        cmocka_unit_test(test_read_only),          cmocka_unit_test(test_missing_folder),
        cmocka_unit_test(test_write_error),        cmocka_unit_test(test_index_text),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
