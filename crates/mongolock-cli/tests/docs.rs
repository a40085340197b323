//! End-to-end tests of `mongolock completions`, `mongolock man` and usage lines, on the real
//! binary (no database needed).

mod common;

use std::process::{Output, Stdio};

use common::*;
use tokio::process::Command;

async fn mongolock(args: &[&str]) -> Output {
    let child = Command::new(BIN)
        .args(args)
        .env_remove("MONGODB_URI")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn mongolock");
    finish(child, LONG).await
}

async fn sh(program: &str, args: &[&str]) -> Output {
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
    finish(child, LONG).await
}

fn scratch(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mongolock-docs-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn bash_completion_parses_and_defines_the_completion_function() {
    let out = mongolock(&["completions", "bash"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let script = text(&out.stdout);
    for word in [
        "exec",
        "elect",
        "watch",
        "--conflict-exit-code",
        "--json-fd",
    ] {
        assert!(script.contains(word), "completion lacks {word}");
    }
    assert!(
        !script.contains("__supervise"),
        "hidden commands are not completed"
    );
    let dir = scratch("bash");
    let file = dir.join("mongolock.bash");
    std::fs::write(&file, &script).expect("write the script");
    let path = file.to_str().expect("utf-8 path");

    let out = sh("bash", &["-n", path]).await;
    assert_eq!(out.status.code(), Some(0), "bash -n: {}", describe(&out));
    // Sourcing it registers a completion for `mongolock` that names a defined function.
    let check = format!(
        "source '{path}' && spec=$(complete -p mongolock) && echo \"$spec\" && \
         fn=$(echo \"$spec\" | sed -n 's/.*-F \\([^ ]*\\).*/\\1/p') && [ -n \"$fn\" ] && \
         declare -F \"$fn\""
    );
    let out = sh("bash", &["-c", &check]).await;
    assert_eq!(out.status.code(), Some(0), "sourcing: {}", describe(&out));
    assert!(
        text(&out.stdout).contains("mongolock"),
        "{}",
        describe(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);

    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = mongolock(&["completions", shell]).await;
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", describe(&out));
        assert!(text(&out.stdout).contains("mongolock"), "{shell}");
    }
    let out = mongolock(&["completions", "tcsh"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
}

/// Renders roff with `man -l` to plain text; `None` (and a printed reason) without `man`.
async fn render_man(page: &std::path::Path) -> Option<String> {
    let probe = Command::new("man").arg("--version").output().await;
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped rendering: `man` is not installed (install man-db)");
        return None;
    }
    let child = Command::new("man")
        .arg("-l")
        .arg(page)
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .env("MANWIDTH", "100")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn man");
    let out = finish(child, LONG).await;
    assert_eq!(out.status.code(), Some(0), "man -l: {}", describe(&out));
    let stderr = text(&out.stderr);
    assert!(
        !stderr.contains("warning") && !stderr.contains("error"),
        "man -l complained: {}",
        describe(&out)
    );
    Some(text(&out.stdout))
}

#[tokio::test(flavor = "multi_thread")]
async fn man_pages_render_with_man() {
    let dir = scratch("man");
    let out = mongolock(&["man"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(text(&out.stdout).starts_with(".ie") || text(&out.stdout).contains(".TH"));
    let main = dir.join("main.1");
    std::fs::write(&main, &out.stdout).expect("write the page");
    if let Some(page) = render_man(&main).await {
        for word in [
            "mongolock",
            "exec",
            "elect",
            "watch",
            "--uri",
            "MONGODB_URI",
        ] {
            assert!(page.contains(word), "the page lacks {word}:\n{page}");
        }
    }

    let out = mongolock(&["man", "exec"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let exec = dir.join("exec.1");
    std::fs::write(&exec, &out.stdout).expect("write the page");
    if let Some(page) = render_man(&exec).await {
        for word in [
            "mongolock-exec",
            "--conflict-exit-code",
            "MONGOLOCK_TTL",
            "--json-fd",
            "MONGOLOCK_FENCING_TOKENS",
        ] {
            assert!(page.contains(word), "the exec page lacks {word}:\n{page}");
        }
    }

    let out = mongolock(&["man", "no-such-command"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(text(&out.stderr).contains("exec"), "{}", describe(&out));

    let pages = dir.join("pages");
    let out = mongolock(&["man", "--dir", pages.to_str().expect("utf-8")]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    for page in [
        "mongolock.1",
        "mongolock-exec.1",
        "mongolock-elect.1",
        "mongolock-watch.1",
        "mongolock-release.1",
    ] {
        assert!(pages.join(page).exists(), "{page} was not written");
    }
    let written: Vec<String> = std::fs::read_dir(&pages)
        .expect("read the directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !written
            .iter()
            .any(|p| p.contains("supervise") || p.contains("worker")),
        "hidden commands get no page: {written:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn release_usage_does_not_suggest_that_uri_is_required() {
    let out = mongolock(&["release", "--help"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let help = text(&out.stdout);
    let usage = help
        .lines()
        .find(|l| l.starts_with("Usage:"))
        .unwrap_or_else(|| panic!("no usage line:\n{help}"));
    assert!(!usage.contains("--uri"), "{usage}");
    assert!(
        usage.contains("release --force [--token N] <NAME>"),
        "{usage}"
    );
    // The usage shown with an error says the same.
    let out = mongolock(&["release", "some-lock"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("--force"), "{stderr}");
    assert!(!stderr.contains("--uri <"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn main_help_lists_the_new_commands_and_the_environment() {
    let out = mongolock(&["--help"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let help = text(&out.stdout);
    for word in [
        "watch",
        "completions",
        "man",
        "MONGOLOCK_TTL",
        "MONGOLOCK_WAIT",
        "MONGOLOCK_GRACE",
        "--json-fd",
    ] {
        assert!(help.contains(word), "--help lacks {word}:\n{help}");
    }
    assert_eq!(
        help.contains("mongolock demo"),
        cfg!(feature = "demo"),
        "{help}"
    );
    for command in ["watch", "completions", "man"] {
        let out = mongolock(&[command, "--help"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        assert!(text(&out.stdout).contains("Examples:"), "{command} --help");
    }
}

/// The main page has real EXAMPLES, ENVIRONMENT and EXIT STATUS sections (not the text after
/// the options reflowed into one EXTRA paragraph): each example command on a line of its own,
/// each variable and status an entry.
#[tokio::test(flavor = "multi_thread")]
async fn man_pages_have_examples_environment_and_exit_status_sections() {
    let out = mongolock(&["man"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let roff = text(&out.stdout);
    for section in [
        ".SH \"EXAMPLES\"",
        ".SH \"ENVIRONMENT\"",
        ".SH \"EXIT STATUS\"",
    ] {
        assert!(roff.contains(section), "the page lacks {section}:\n{roff}");
    }
    assert!(!roff.contains("EXTRA"), "{roff}");
    let dir = scratch("mansections");
    let main = dir.join("main.1");
    std::fs::write(&main, &out.stdout).expect("write the page");
    if let Some(page) = render_man(&main).await {
        let lines: Vec<&str> = page.lines().map(str::trim).collect();
        for heading in ["EXAMPLES", "ENVIRONMENT", "EXIT STATUS"] {
            assert!(lines.contains(&heading), "no {heading} heading:\n{page}");
        }
        // Commands are not filled into the text around them.
        for command in [
            "mongolock exec --wait 0 nightly-report -- ./report.sh",
            "mongolock elect scheduler -- ./scheduler",
            "mongolock list",
        ] {
            assert!(
                lines.contains(&command),
                "{command:?} is not a line of its own:\n{page}"
            );
        }
        assert!(
            lines.contains(&"MONGOLOCK_TTL, MONGOLOCK_WAIT, MONGOLOCK_GRACE"),
            "the variables are not an entry:\n{page}"
        );
        assert!(lines.contains(&"MONGOLOCK_QUIET"), "{page}");
        for status in ["0", "1", "2", "75", "76", "126", "127", "128+N"] {
            assert!(
                lines
                    .iter()
                    .any(|l| *l == status || l.starts_with(&format!("{status} "))),
                "exit status {status} is not an entry:\n{page}"
            );
        }
    }
    // A command's page: its examples, and its exit status note.
    let out = mongolock(&["man", "inspect"]).await;
    let roff = text(&out.stdout);
    assert!(
        roff.contains(".SH \"EXAMPLES\"") && roff.contains(".SH \"EXIT STATUS\""),
        "{roff}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
