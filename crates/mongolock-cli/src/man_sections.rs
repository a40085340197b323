//! The manual pages: clap_mangen's sections (NAME, SYNOPSIS, DESCRIPTION, OPTIONS, COMMANDS,
//! VERSION), and, in place of its EXTRA section (the text after the options in `--help`
//! reflowed into one paragraph), real EXAMPLES, ENVIRONMENT and EXIT STATUS sections made from
//! that same text, so that the page and `--help` cannot drift apart.
//!
//! The text after the options (`after_help` in `cli.rs`) is read as blocks under headings at
//! the start of a line ending with `:` — `Examples:`, `Environment:`, `Exit statuses:` — with
//! indented lines below:
//! * Examples: `# comment` lines introduce an example; the command lines after them are shown
//!   as they are (no filling), one per line;
//! * Environment and Exit statuses: `TERM   description` (two or more spaces between) makes an
//!   entry; a line indented further continues the description; other lines are paragraphs.
//!
//! A paragraph at the start of a line that is not a heading (`Exits with status 3 when ...`)
//! goes into EXIT STATUS when it starts with "Exit", into NOTES otherwise.

use std::io::Write;

/// One man section: its heading and roff body.
struct Section {
    heading: &'static str,
    roff: String,
}

/// Renders the manual page of `command` (already built) in roff.
pub fn render(command: &clap::Command, w: &mut dyn Write) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(command.clone());
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    if command.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(w)?;
    }
    if command.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(w)?;
    }
    let after = command
        .get_after_long_help()
        .or_else(|| command.get_after_help())
        .map(|s| s.to_string());
    if let Some(text) = after {
        for section in sections(&text) {
            write!(w, ".SH \"{}\"\n{}", section.heading, section.roff)?;
        }
    }
    if command.get_version().is_some() || command.get_long_version().is_some() {
        man.render_version_section(w)?;
    }
    if command.get_author().is_some() {
        man.render_authors_section(w)?;
    }
    Ok(())
}

/// Writes the page of `command` and of each visible subcommand into `dir` as `NAME.1`
/// (`mongolock.1`, `mongolock-exec.1`), like `clap_mangen::generate_to`.
pub fn generate_to(command: &clap::Command, dir: &std::path::Path) -> std::io::Result<()> {
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        generate_to(sub, dir)?;
    }
    let name = command
        .get_display_name()
        .unwrap_or_else(|| command.get_name());
    let mut page = Vec::new();
    render(command, &mut page)?;
    std::fs::write(dir.join(format!("{name}.1")), page)
}

/// The sections of an `after_help` text, in the order they first appear.
fn sections(text: &str) -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    let mut current: Option<(&'static str, Vec<&str>)> = None;
    for line in text.lines() {
        let top = !line.is_empty() && !line.starts_with(' ');
        if top && line.ends_with(':') {
            flush(current.take(), &mut out);
            let heading = match line.trim_end_matches(':') {
                "Examples" | "Example" => "EXAMPLES",
                "Environment" => "ENVIRONMENT",
                "Exit statuses" | "Exit status" => "EXIT STATUS",
                _ => "NOTES",
            };
            current = Some((heading, Vec::new()));
        } else if top
            && current
                .as_ref()
                .is_none_or(|(_, l)| l.last().is_none_or(|l| l.is_empty()))
        {
            // A paragraph of its own (after a blank line).
            flush(current.take(), &mut out);
            let heading = if line.starts_with("Exit") {
                "EXIT STATUS"
            } else {
                "NOTES"
            };
            current = Some((heading, vec![line]));
        } else if let Some((_, lines)) = &mut current {
            lines.push(line);
        }
    }
    flush(current, &mut out);
    out
}

/// Renders one block and adds it to its section in `out`.
fn flush(block: Option<(&'static str, Vec<&str>)>, out: &mut Vec<Section>) {
    let Some((heading, lines)) = block else {
        return;
    };
    let roff = match heading {
        "EXAMPLES" => examples(&lines),
        "NOTES" | "EXIT STATUS" if lines.first().is_some_and(|l| !l.starts_with(' ')) => {
            paragraph(&lines)
        }
        _ => entries(&lines),
    };
    match out.iter_mut().find(|s| s.heading == heading) {
        Some(s) => s.roff.push_str(&roff),
        None => out.push(Section { heading, roff }),
    }
}

/// Escapes text for roff: backslashes, hyphens (so that options stay `-` when copied), and a
/// leading `.` or `'` (which would start a request).
fn escape(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    if escaped.starts_with('.') || escaped.starts_with('\'') {
        format!("\\&{escaped}")
    } else {
        escaped
    }
}

/// `# comment` lines as paragraphs, command lines as unfilled, indented blocks.
fn examples(lines: &[&str]) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for line in lines {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        if let Some(comment) = trimmed.strip_prefix('#') {
            if in_code {
                out.push_str(".fi\n.RE\n");
                in_code = false;
            }
            out.push_str(&format!(".PP\n{}\n", escape(comment.trim())));
        } else {
            if !in_code {
                out.push_str(".PP\n.RS 4\n.nf\n");
                in_code = true;
            }
            out.push_str(&format!("{}\n", escape(trimmed)));
        }
    }
    if in_code {
        out.push_str(".fi\n.RE\n");
    }
    out
}

/// `TERM   description` entries as `.TP` items; further-indented lines continue the previous
/// description; lines without a two-space gap are paragraphs.
fn entries(lines: &[&str]) -> String {
    let mut items: Vec<(Option<String>, String)> = Vec::new();
    for line in lines {
        if line.trim().is_empty() {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let body = line.trim();
        let continues = indent > 2 && !items.is_empty();
        if continues {
            if let Some((_, text)) = items.last_mut() {
                text.push(' ');
                text.push_str(body);
            }
        } else if let Some((term, text)) = body.split_once("  ") {
            items.push((Some(term.trim().to_owned()), text.trim().to_owned()));
        } else {
            items.push((None, body.to_owned()));
        }
    }
    let mut out = String::new();
    for (term, text) in items {
        match term {
            Some(term) => out.push_str(&format!(
                ".TP\n\\fB{}\\fR\n{}\n",
                escape(&term),
                escape(&text)
            )),
            None => out.push_str(&format!(".PP\n{}\n", escape(&text))),
        }
    }
    out
}

/// Plain text lines as one filled paragraph.
fn paragraph(lines: &[&str]) -> String {
    let text: Vec<&str> = lines
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect();
    format!(".PP\n{}\n", escape(&text.join(" ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_help_becomes_sections() {
        let text = "Examples:\n  # Run it:\n  mongolock exec x -- true\n\n  mongolock list\n\n\
                    Environment:\n  A, B   --a, --b\n  C      the c\n         and more\n\n\
                    Exit statuses:\n  0      success\n  75     busy\n\n\
                    Exits with status 3 when there is none.";
        let s = sections(text);
        let headings: Vec<&str> = s.iter().map(|s| s.heading).collect();
        assert_eq!(headings, ["EXAMPLES", "ENVIRONMENT", "EXIT STATUS"]);
        assert!(s[0]
            .roff
            .contains(".PP\nRun it:\n.PP\n.RS 4\n.nf\nmongolock exec x \\-\\- true\n"));
        assert!(
            s[1].roff.contains(".TP\n\\fBC\\fR\nthe c and more\n"),
            "{}",
            s[1].roff
        );
        assert!(
            s[2].roff.contains(".TP\n\\fB75\\fR\nbusy\n"),
            "{}",
            s[2].roff
        );
        assert!(s[2]
            .roff
            .contains(".PP\nExits with status 3 when there is none.\n"));
    }
}
