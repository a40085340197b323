//! `$regex` and regex query values, matched with the `regex` crate.
//!
//! mongod matches with PCRE2 in UTF mode without UCP. The `regex` crate spells several things
//! differently and means a few things differently, so a pattern is parsed here (PCRE syntax)
//! and re-emitted for the `regex` crate with PCRE's meaning:
//!
//! - options `i`, `m`, `s`, `x` (and inline `(?imsx-imsx)`, `(?i:...)`) are applied here, per
//!   atom; `u` is accepted; any other option letter is error 51108 as in mongod.
//! - `\d \w \s \b` and POSIX classes are ASCII, as in PCRE without UCP; `\h \v \N` are
//!   translated; `\p{..}` is not case-folded (PCRE: `i` does not affect properties).
//! - `$` (without `m`) and `\Z` match at the end or before a final newline: exact through
//!   `\z` for strings that do not end with `\n`, and through a second compiled form for strings
//!   that do. Multi-line `^` does not match after a final newline. Where the second form could
//!   differ from PCRE (e.g. `$` followed by more pattern), matching such a string is refused.
//! - Features the `regex` crate lacks (backreferences, lookaround, atomic groups, possessive
//!   quantifiers, recursion, conditionals, `\G \K \R \X`...) are refused with error 51091,
//!   naming the feature. Nothing is matched with silently different semantics.
//!
//! Only whether a string matches is asked, so greediness and capture groups do not matter.

use crate::error::{CommandError, CommandResult};

/// A compiled MongoDB (PCRE) regular expression.
#[derive(Debug, Clone)]
pub struct Regex {
    pattern: String,
    options: String,
    /// Exact for strings that do not end with `\n`.
    plain: regex::Regex,
    /// What to use for strings that end with `\n`.
    trailing_newline: TrailingNewline,
}

#[derive(Debug, Clone)]
enum TrailingNewline {
    /// The pattern has no end-or-before-final-newline `$`/`\Z` and no multi-line `^`.
    Plain,
    Own(regex::Regex),
    Refused(&'static str),
}

fn invalid(msg: &str, pattern: &str) -> CommandError {
    CommandError::new(
        51091,
        "Location51091",
        format!("Regular expression is invalid: {msg} (in /{pattern}/)"),
    )
}

fn unsupported(feature: &str, pattern: &str) -> CommandError {
    CommandError::new(
        51091,
        "Location51091",
        format!(
            "Regular expression is invalid: {feature} not supported by mongo-testserver (in /{pattern}/)"
        ),
    )
}

#[derive(Debug, Clone, Copy, Default)]
struct Flags {
    icase: bool,
    multiline: bool,
    dotall: bool,
    extended: bool,
}

#[derive(Debug)]
enum Node {
    /// Consumes exactly one character; already in `regex` syntax with its flags applied.
    Atom(String),
    Look(Look),
    Concat(Vec<Node>),
    Alt(Vec<Node>),
    Group(Box<Node>),
    Repeat {
        node: Box<Node>,
        min: u32,
        max: Option<u32>,
    },
}

#[derive(Debug, Clone, Copy)]
enum Look {
    TextStart,
    TextEnd,
    /// `$` without `m`, and `\Z`: at the end or before a final `\n`.
    EndOrFinalNewline,
    /// `^` with `m`: at the start or after a `\n` that does not end the string.
    LineStart,
    /// `$` with `m`: at the end or before any `\n`.
    LineEnd,
    WordBoundary,
    NotWordBoundary,
}

enum Esc {
    Char(char),
    /// A fixed set in `regex` class syntax (never case-folded); `true` for `\p`/`\P`.
    Set(String, bool),
    Look(Look),
}

const DIGIT: &str = "0-9";
const WORD: &str = "0-9A-Za-z_";
const SPACE: &str = r"\t\n\x0B\x0C\r ";
const HSPACE: &str = r"\t \xA0\x{1680}\x{180E}\x{2000}-\x{200A}\x{202F}\x{205F}\x{3000}";
const VSPACE: &str = r"\n\x0B\x0C\r\x{85}\x{2028}\x{2029}";

/// The characters whose case-fold orbits straddle ASCII and non-ASCII (k K U+212A, s S U+017F):
/// the only ones where folding a fixed ASCII set changes it.
const STRADDLING: [char; 6] = ['k', 'K', '\u{212A}', 's', 'S', '\u{17F}'];
const STRADDLING_CLASS: &str = r"[^kKsS\x{212A}\x{17F}]";

fn fixed_escape(c: char) -> Option<String> {
    let (set, negated) = match c {
        'd' | 'D' => (DIGIT, c == 'D'),
        'w' | 'W' => (WORD, c == 'W'),
        's' | 'S' => (SPACE, c == 'S'),
        'h' | 'H' => (HSPACE, c == 'H'),
        'v' | 'V' => (VSPACE, c == 'V'),
        _ => return None,
    };
    Some(format!("[{}{set}]", if negated { "^" } else { "" }))
}

fn escape_char(c: char) -> String {
    regex::escape(c.encode_utf8(&mut [0; 4]))
}

fn literal(c: char, flags: Flags) -> String {
    let e = escape_char(c);
    if flags.icase && (c.is_alphabetic() || !c.is_ascii()) {
        format!("(?i:{e})")
    } else {
        e
    }
}

fn is_extended_space(c: char) -> bool {
    matches!(
        c,
        ' ' | '\t'
            | '\n'
            | '\x0b'
            | '\x0c'
            | '\r'
            | '\u{85}'
            | '\u{200E}'
            | '\u{200F}'
            | '\u{2028}'
            | '\u{2029}'
    )
}

struct Parser<'a> {
    chars: Vec<char>,
    pos: usize,
    pattern: &'a str,
    /// Capture groups opened so far (decides whether `\NN` is a backreference or octal).
    captures: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, n: usize) -> Option<char> {
        self.chars.get(self.pos + n).copied()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek();
        if c.is_some() {
            self.pos += 1;
        }
        c
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn invalid(&self, msg: &str) -> CommandError {
        invalid(msg, self.pattern)
    }

    fn unsupported(&self, feature: &str) -> CommandError {
        unsupported(feature, self.pattern)
    }

    fn skip_extended(&mut self, flags: Flags) {
        if !flags.extended {
            return;
        }
        while let Some(c) = self.peek() {
            if is_extended_space(c) {
                self.pos += 1;
            } else if c == '#' {
                while let Some(c) = self.next() {
                    if c == '\n' {
                        break;
                    }
                }
            } else {
                break;
            }
        }
    }

    fn alternation(&mut self, flags: &mut Flags) -> CommandResult<Node> {
        let mut branches = vec![self.sequence(flags)?];
        while self.eat('|') {
            branches.push(self.sequence(flags)?);
        }
        Ok(if branches.len() == 1 {
            branches.remove(0)
        } else {
            Node::Alt(branches)
        })
    }

    fn sequence(&mut self, flags: &mut Flags) -> CommandResult<Node> {
        let mut seq = Vec::new();
        loop {
            self.skip_extended(*flags);
            let atom = match (self.peek(), self.peek_at(1)) {
                (None | Some('|' | ')'), _) => break,
                (Some('\\'), Some('E')) => {
                    self.pos += 2;
                    continue;
                }
                (Some('\\'), Some('Q')) => {
                    self.pos += 2;
                    let mut quoted = self.quoted().into_iter();
                    let Some(last) = quoted.next_back() else {
                        continue;
                    };
                    seq.extend(quoted.map(|c| Node::Atom(literal(c, *flags))));
                    Node::Atom(literal(last, *flags))
                }
                (Some('('), _) => match self.group(flags)? {
                    Some(node) => node,
                    None => continue,
                },
                _ => self.atom(*flags)?,
            };
            seq.push(self.quantified(atom, *flags)?);
        }
        Ok(Node::Concat(seq))
    }

    /// The characters after `\Q`, up to `\E` or the end of the pattern.
    fn quoted(&mut self) -> Vec<char> {
        let mut out = Vec::new();
        while let Some(c) = self.next() {
            if c == '\\' && self.eat('E') {
                break;
            }
            out.push(c);
        }
        out
    }

    /// `{n}`, `{n,}` or `{n,m}` at `pos`: (min, max, length). Anything else is a literal `{`.
    fn counted_at(&self, pos: usize) -> Option<(u64, Option<u64>, usize)> {
        let mut i = pos + 1;
        let number = |i: &mut usize| {
            let start = *i;
            let mut v: u64 = 0;
            while let Some(d) = self.chars.get(*i).and_then(|c| c.to_digit(10)) {
                v = v.saturating_mul(10).saturating_add(u64::from(d));
                *i += 1;
            }
            (*i > start).then_some(v)
        };
        let min = number(&mut i)?;
        let max = match self.chars.get(i) {
            Some('}') => Some(min),
            Some(',') => {
                i += 1;
                let max = number(&mut i);
                if self.chars.get(i) != Some(&'}') {
                    return None;
                }
                max
            }
            _ => return None,
        };
        Some((min, max, i + 1 - pos))
    }

    fn quantifier(&mut self) -> CommandResult<Option<(u32, Option<u32>)>> {
        let q = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => {
                let Some((min, max, len)) = self.counted_at(self.pos) else {
                    return Ok(None);
                };
                self.pos += len - 1;
                let limit = |v: u64| {
                    u32::try_from(v)
                        .ok()
                        .filter(|v| *v <= 65535)
                        .ok_or_else(|| self.invalid("number too big in {} quantifier"))
                };
                let (min, max) = (limit(min)?, max.map(limit).transpose()?);
                if max.is_some_and(|m| m < min) {
                    return Err(self.invalid("numbers out of order in {} quantifier"));
                }
                (min, max)
            }
            _ => return Ok(None),
        };
        self.pos += 1;
        Ok(Some(q))
    }

    fn is_quantifier_next(&self) -> bool {
        match self.peek() {
            Some('*' | '+' | '?') => true,
            Some('{') => self.counted_at(self.pos).is_some(),
            _ => false,
        }
    }

    fn quantified(&mut self, atom: Node, flags: Flags) -> CommandResult<Node> {
        self.skip_extended(flags);
        let Some((min, max)) = self.quantifier()? else {
            return Ok(atom);
        };
        if matches!(atom, Node::Look(_)) {
            return Err(self.unsupported("a quantifier on an assertion is"));
        }
        // A lazy marker changes which match is found, not whether one is.
        if !self.eat('?') && self.peek() == Some('+') {
            return Err(self.unsupported("possessive quantifiers (*+, ++, ?+, {n}+) are"));
        }
        self.skip_extended(flags);
        if self.is_quantifier_next() {
            return Err(self.invalid("quantifier does not follow a repeatable item"));
        }
        Ok(Node::Repeat {
            node: Box::new(atom),
            min,
            max,
        })
    }

    fn atom(&mut self, flags: Flags) -> CommandResult<Node> {
        if self.is_quantifier_next() {
            return Err(self.invalid("quantifier does not follow a repeatable item"));
        }
        let Some(c) = self.next() else {
            return Err(self.invalid("unexpected end of pattern"));
        };
        Ok(match c {
            '.' if flags.dotall => Node::Atom("(?s:.)".into()),
            '.' => Node::Atom(".".into()),
            '^' if flags.multiline => Node::Look(Look::LineStart),
            '^' => Node::Look(Look::TextStart),
            '$' if flags.multiline => Node::Look(Look::LineEnd),
            '$' => Node::Look(Look::EndOrFinalNewline),
            '[' => self.class(flags)?,
            '\\' => match self.escape(false)? {
                Esc::Char(ch) => Node::Atom(literal(ch, flags)),
                Esc::Set(set, _) => Node::Atom(set),
                Esc::Look(look) => Node::Look(look),
            },
            other => Node::Atom(literal(other, flags)),
        })
    }

    /// A `(`...: a group, or `None` for an option setting `(?i)` or a comment `(?#...)`.
    fn group(&mut self, flags: &mut Flags) -> CommandResult<Option<Node>> {
        self.pos += 1;
        let mut inner = *flags;
        if self.peek() == Some('*') {
            return Err(self.unsupported("(*VERB) control verbs are"));
        }
        if self.eat('?') {
            match self.next() {
                Some(':' | '|') => {}
                Some('#') => {
                    while let Some(c) = self.next() {
                        if c == ')' {
                            return Ok(None);
                        }
                    }
                    return Err(self.invalid("missing ) after (?# comment"));
                }
                Some('=' | '!') => return Err(self.unsupported("lookahead assertions are")),
                Some('<') if matches!(self.peek(), Some('=' | '!')) => {
                    return Err(self.unsupported("lookbehind assertions are"))
                }
                Some('<') => self.group_name('>')?,
                Some('\'') => self.group_name('\'')?,
                Some('P') => match self.next() {
                    Some('<') => self.group_name('>')?,
                    Some('=') => return Err(self.unsupported("backreferences are")),
                    Some('>') => return Err(self.unsupported("subroutine calls are")),
                    _ => return Err(self.invalid("unrecognized character after (?P")),
                },
                Some('>') => return Err(self.unsupported("atomic groups are")),
                Some('(') => return Err(self.unsupported("conditional groups are")),
                Some('C') => return Err(self.unsupported("callouts are")),
                Some('R' | '&' | '+' | '0'..='9') => {
                    return Err(self.unsupported("recursion and subroutine calls are"))
                }
                Some('-') if self.peek().is_some_and(|c| c.is_ascii_digit()) => {
                    return Err(self.unsupported("recursion and subroutine calls are"))
                }
                Some('i' | 'm' | 'n' | 's' | 'x' | 'J' | 'U' | '-' | '^') => {
                    self.pos -= 1;
                    if self.inline_options(&mut inner)? {
                        *flags = inner;
                        return Ok(None);
                    }
                }
                _ => return Err(self.invalid("unrecognized character after (? or (?-")),
            }
        } else {
            self.captures += 1;
        }
        let body = self.alternation(&mut inner)?;
        if !self.eat(')') {
            return Err(self.invalid("missing closing parenthesis"));
        }
        Ok(Some(Node::Group(Box::new(body))))
    }

    /// `imnsxJU-^` letters up to `)` (returns true: the options apply to the rest of the
    /// enclosing group) or `:` (false: a group with these options follows).
    fn inline_options(&mut self, flags: &mut Flags) -> CommandResult<bool> {
        let mut on = true;
        if self.eat('^') {
            *flags = Flags::default();
        }
        loop {
            match self.next() {
                Some(')') => return Ok(true),
                Some(':') => return Ok(false),
                Some('-') if on => on = false,
                Some('i') => flags.icase = on,
                Some('m') => flags.multiline = on,
                Some('s') => flags.dotall = on,
                Some('x') if self.peek() == Some('x') => {
                    return Err(self.unsupported("the xx option is"))
                }
                Some('x') => flags.extended = on,
                // Capture numbering, duplicate names and greediness do not change whether a
                // string matches.
                Some('n' | 'J' | 'U') => {}
                _ => return Err(self.invalid("unrecognized character after (? or (?-")),
            }
        }
    }

    fn group_name(&mut self, end: char) -> CommandResult<()> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_alphanumeric() || c == '_') {
            self.pos += 1;
        }
        if self.pos == start || !self.eat(end) {
            return Err(self.invalid("syntax error in subpattern name (missing terminator?)"));
        }
        self.captures += 1;
        Ok(())
    }

    fn escape(&mut self, in_class: bool) -> CommandResult<Esc> {
        let Some(c) = self.next() else {
            return Err(self.invalid("\\ at end of pattern"));
        };
        if let Some(set) = fixed_escape(c) {
            return Ok(Esc::Set(set, false));
        }
        let ch = match c {
            'p' | 'P' => return Ok(Esc::Set(self.property(c == 'P')?, true)),
            'b' if in_class => '\x08',
            'A' | 'z' | 'Z' | 'b' | 'B' | 'N' | 'G' | 'K' | 'R' | 'X' if in_class => {
                return Err(self.invalid("escape sequence is invalid in character class"))
            }
            'A' => return Ok(Esc::Look(Look::TextStart)),
            'z' => return Ok(Esc::Look(Look::TextEnd)),
            'Z' => return Ok(Esc::Look(Look::EndOrFinalNewline)),
            'b' => return Ok(Esc::Look(Look::WordBoundary)),
            'B' => return Ok(Esc::Look(Look::NotWordBoundary)),
            'N' if self.peek() == Some('{') => return Err(self.unsupported("\\N{...} is")),
            'N' => return Ok(Esc::Set(r"[^\n]".into(), false)),
            'a' => '\x07',
            'e' => '\x1b',
            'f' => '\x0c',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'x' if self.eat('{') => self.braced_code(16)?,
            'x' => self.digits_code(16, 2)?,
            'o' if self.eat('{') => self.braced_code(8)?,
            'o' => return Err(self.invalid("missing opening brace after \\o")),
            'c' => match self.next() {
                Some(x) if (' '..='\x7e').contains(&x) => {
                    char::from((x.to_ascii_uppercase() as u8) ^ 0x40)
                }
                _ => {
                    return Err(self.invalid("\\c must be followed by a printable ASCII character"))
                }
            },
            '0' => self.digits_code(8, 2)?,
            // PCRE2: in a class, \8 and \9 are literals and other digits start an octal code.
            '8' | '9' if in_class => c,
            '1'..='7' if in_class => {
                self.pos -= 1;
                self.digits_code(8, 3)?
            }
            // Outside: a backreference if the decimal number is below 10, starts with 8 or 9,
            // or is at most the number of groups opened so far; else up to 3 octal digits.
            '1'..='9' => {
                let start = self.pos - 1;
                let mut end = start;
                while self.chars.get(end).is_some_and(|d| d.is_ascii_digit()) {
                    end += 1;
                }
                let number: String = self.chars[start..end].iter().collect();
                let n = number.parse::<usize>().unwrap_or(usize::MAX);
                if n < 10 || matches!(c, '8' | '9') || n <= self.captures {
                    return Err(self.unsupported("backreferences are"));
                }
                self.pos = start;
                self.digits_code(8, 3)?
            }
            'g' | 'k' if !in_class => return Err(self.unsupported("backreferences are")),
            'G' => return Err(self.unsupported("\\G is")),
            'K' => return Err(self.unsupported("\\K (match start reset) is")),
            'R' => return Err(self.unsupported("\\R (atomic newline sequence) is")),
            'X' => return Err(self.unsupported("\\X (extended grapheme cluster) is")),
            'C' => return Err(self.unsupported("\\C (one code unit) is")),
            c if c.is_ascii_alphanumeric() => {
                return Err(self.invalid(&format!("unrecognized character follows \\: {c}")))
            }
            c => c,
        };
        Ok(Esc::Char(ch))
    }

    /// Up to `max` digits in `radix` (none is 0).
    fn digits_code(&mut self, radix: u32, max: usize) -> CommandResult<char> {
        let mut v = 0u32;
        for _ in 0..max {
            match self.peek().and_then(|c| c.to_digit(radix)) {
                Some(d) => {
                    v = v * radix + d;
                    self.pos += 1;
                }
                None => break,
            }
        }
        char::from_u32(v).ok_or_else(|| self.invalid("invalid character code point"))
    }

    /// Digits in `radix` up to `}` (after `\x{` or `\o{`).
    fn braced_code(&mut self, radix: u32) -> CommandResult<char> {
        let mut v = 0u32;
        let mut any = false;
        while let Some(d) = self.peek().and_then(|c| c.to_digit(radix)) {
            v = v.saturating_mul(radix).saturating_add(d);
            any = true;
            self.pos += 1;
        }
        if !any || !self.eat('}') {
            return Err(self.invalid("malformed \\x{} or \\o{} escape"));
        }
        char::from_u32(v).ok_or_else(|| self.invalid("character code point value is too large"))
    }

    fn property(&mut self, mut negated: bool) -> CommandResult<String> {
        let mut name = String::new();
        if self.eat('{') {
            loop {
                match self.next() {
                    Some('}') => break,
                    Some(c) if c.is_ascii_alphanumeric() || " _-&=:^".contains(c) => name.push(c),
                    _ => return Err(self.invalid("malformed \\p or \\P sequence")),
                }
            }
        } else if let Some(c) = self.next().filter(|c| c.is_ascii_alphabetic()) {
            name.push(c);
        } else {
            return Err(self.invalid("malformed \\p or \\P sequence"));
        }
        if let Some(rest) = name.strip_prefix('^') {
            negated = !negated;
            name = rest.to_string();
        }
        if name == "L&" {
            name = "LC".into();
        }
        let name = name.replace(':', "=");
        if name.is_empty() || name.contains(['&', '^']) {
            return Err(self.invalid("unknown property name after \\P or \\p"));
        }
        Ok(format!(r"\{}{{{name}}}", if negated { 'P' } else { 'p' }))
    }

    /// `[:name:]` at the current position (after a `[` inside a class), if it is one.
    fn posix_class(&mut self, flags: Flags) -> CommandResult<Option<String>> {
        let Some(delim) = self.peek().filter(|c| matches!(c, ':' | '.' | '=')) else {
            return Ok(None);
        };
        let mut i = self.pos + 1;
        while self
            .chars
            .get(i)
            .is_some_and(|c| c.is_ascii_alphabetic() || *c == '^')
        {
            i += 1;
        }
        if self.chars.get(i) != Some(&delim) || self.chars.get(i + 1) != Some(&']') {
            return Ok(None);
        }
        if delim != ':' {
            return Err(self.invalid("POSIX collating elements are not supported"));
        }
        let text: String = self.chars[self.pos + 1..i].iter().collect();
        self.pos = i + 2;
        let (negated, mut name) = match text.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, text.as_str()),
        };
        const NAMES: [&str; 14] = [
            "alpha", "lower", "upper", "alnum", "ascii", "blank", "cntrl", "digit", "graph",
            "print", "punct", "space", "word", "xdigit",
        ];
        if !NAMES.contains(&name) {
            return Err(self.invalid("unknown POSIX class name"));
        }
        // PCRE: with caseless matching, [:upper:] and [:lower:] match all letters.
        if flags.icase && (name == "upper" || name == "lower") {
            name = "alpha";
        }
        Ok(Some(format!(
            "[[:{}{name}:]]",
            if negated { "^" } else { "" }
        )))
    }

    fn class(&mut self, flags: Flags) -> CommandResult<Node> {
        let negated = self.eat('^');
        let mut folded = String::new();
        let mut fixed = String::new();
        let mut has_property = false;
        let mut first = true;
        loop {
            let Some(c) = self.next() else {
                return Err(self.invalid("missing terminating ] for character class"));
            };
            if c == ']' && !first {
                break;
            }
            first = false;
            let lo = match c {
                '[' => match self.posix_class(flags)? {
                    Some(set) => {
                        fixed.push_str(&set);
                        self.no_range_after_set()?;
                        continue;
                    }
                    None => '[',
                },
                '\\' if self.eat('Q') => {
                    for q in self.quoted() {
                        folded.push_str(&escape_char(q));
                    }
                    continue;
                }
                '\\' if self.eat('E') => continue,
                '\\' => match self.escape(true)? {
                    Esc::Char(ch) => ch,
                    Esc::Set(set, property) => {
                        fixed.push_str(&set);
                        has_property |= property;
                        self.no_range_after_set()?;
                        continue;
                    }
                    Esc::Look(_) => {
                        return Err(self.invalid("escape sequence is invalid in character class"))
                    }
                },
                other => other,
            };
            if self.peek() == Some('-') && self.peek_at(1).is_some_and(|c| c != ']') {
                self.pos += 1;
                let hi = match self.next() {
                    Some('\\') => match self.escape(true)? {
                        Esc::Char(ch) => ch,
                        _ => return Err(self.invalid("invalid range in character class")),
                    },
                    Some('[') if matches!(self.peek(), Some(':' | '.' | '=')) => {
                        return Err(self.invalid("invalid range in character class"))
                    }
                    Some(ch) => ch,
                    None => return Err(self.invalid("missing terminating ] for character class")),
                };
                if hi < lo {
                    return Err(self.invalid("range out of order in character class"));
                }
                folded.push_str(&format!("{}-{}", escape_char(lo), escape_char(hi)));
            } else {
                folded.push_str(&escape_char(lo));
            }
        }
        self.emit_class(flags, negated, &folded, &fixed, has_property)
            .map(Node::Atom)
    }

    /// PCRE2 refuses a range that starts with a set (`[\d-z]`).
    fn no_range_after_set(&self) -> CommandResult<()> {
        if self.peek() == Some('-') && self.peek_at(1).is_some_and(|c| c != ']') {
            return Err(self.invalid("invalid range in character class"));
        }
        Ok(())
    }

    /// A class of `folded` items (case-folded under `i`) and `fixed` sets (never folded).
    fn emit_class(
        &self,
        flags: Flags,
        negated: bool,
        folded: &str,
        fixed: &str,
        has_property: bool,
    ) -> CommandResult<String> {
        let neg = if negated { "^" } else { "" };
        if folded.is_empty() || fixed.is_empty() || !flags.icase {
            let class = format!("[{neg}{folded}{fixed}]");
            return Ok(if flags.icase && !folded.is_empty() {
                format!("(?i:{class})")
            } else {
                class
            });
        }
        if !negated {
            return Ok(format!("(?:(?i:[{folded}])|[{fixed}])"));
        }
        // Negated, mixed, case-insensitive: PCRE's set is the complement of fold(folded) ∪
        // fixed. Folding the whole class instead is only wrong for characters whose fold orbit
        // straddles a fixed set: for ASCII-based sets, only STRADDLING. Those are decided here.
        if has_property {
            return Err(self.unsupported(
                "\\p{..} together with other items in a negated class under the i option is",
            ));
        }
        let test = |re: String, c: char| -> CommandResult<bool> {
            regex::Regex::new(&re)
                .map(|r| r.is_match(c.encode_utf8(&mut [0; 4])))
                .map_err(|e| self.invalid(&regex_error_detail(&e)))
        };
        let mut extra = String::new();
        for c in STRADDLING {
            let in_folded = test(format!("(?i:[{folded}])"), c)?;
            let in_fixed = test(format!("[{fixed}]"), c)?;
            if !in_folded && !in_fixed {
                extra.push_str(&escape_char(c));
            }
        }
        let main = format!("(?i:[[^{folded}{fixed}]&&{STRADDLING_CLASS}])");
        Ok(if extra.is_empty() {
            main
        } else {
            format!("(?:{main}|[{extra}])")
        })
    }
}

fn regex_error_detail(e: &regex::Error) -> String {
    match e {
        regex::Error::Syntax(s) => s
            .lines()
            .find_map(|l| l.strip_prefix("error: "))
            .unwrap_or(s)
            .to_string(),
        regex::Error::CompiledTooBig(_) => "pattern too large to compile".to_string(),
        other => other.to_string(),
    }
}

fn emit(node: &Node, trailing_newline: bool, out: &mut String) {
    match node {
        Node::Atom(s) => out.push_str(s),
        Node::Look(look) => out.push_str(match look {
            Look::TextStart => r"\A",
            Look::TextEnd => r"\z",
            Look::EndOrFinalNewline if trailing_newline => r"(?:\n?\z)",
            Look::EndOrFinalNewline => r"\z",
            Look::LineStart => "(?m:^)",
            Look::LineEnd => "(?m:$)",
            Look::WordBoundary => r"(?-u:\b)",
            Look::NotWordBoundary => r"(?-u:\B)",
        }),
        Node::Concat(nodes) => nodes.iter().for_each(|n| emit(n, trailing_newline, out)),
        Node::Alt(nodes) => {
            out.push_str("(?:");
            for (i, n) in nodes.iter().enumerate() {
                if i > 0 {
                    out.push('|');
                }
                emit(n, trailing_newline, out);
            }
            out.push(')');
        }
        Node::Group(n) => {
            out.push_str("(?:");
            emit(n, trailing_newline, out);
            out.push(')');
        }
        Node::Repeat { node, min, max } => {
            out.push_str("(?:");
            emit(node, trailing_newline, out);
            out.push(')');
            match max {
                Some(max) => out.push_str(&format!("{{{min},{max}}}")),
                None => out.push_str(&format!("{{{min},}}")),
            }
        }
    }
}

/// Does the pattern contain an anchor whose meaning depends on a final `\n`?
fn newline_sensitive(node: &Node) -> bool {
    match node {
        Node::Look(Look::EndOrFinalNewline | Look::LineStart) => true,
        Node::Atom(_) | Node::Look(_) => false,
        Node::Concat(v) | Node::Alt(v) => v.iter().any(newline_sensitive),
        Node::Group(n) | Node::Repeat { node: n, .. } => newline_sensitive(n),
    }
}

fn min_len(node: &Node) -> u64 {
    match node {
        Node::Atom(_) => 1,
        Node::Look(_) => 0,
        Node::Concat(v) => v.iter().map(min_len).fold(0, u64::saturating_add),
        Node::Alt(v) => v.iter().map(min_len).min().unwrap_or(0),
        Node::Group(n) => min_len(n),
        Node::Repeat { node, min, .. } => min_len(node).saturating_mul(u64::from(*min)),
    }
}

/// Matches only the empty string, with assertions that hold both just before a final `\n` and
/// at the very end (so it can follow a `(?:\n?\z)` that consumed that `\n`).
fn end_only(node: &Node) -> bool {
    match node {
        Node::Atom(_) => false,
        Node::Look(look) => matches!(look, Look::EndOrFinalNewline | Look::LineEnd),
        Node::Concat(v) | Node::Alt(v) => v.iter().all(end_only),
        Node::Group(n) => end_only(n),
        Node::Repeat { node, max, .. } => *max == Some(0) || end_only(node),
    }
}

/// What can follow a node, up to the end of the pattern.
#[derive(Clone, Copy)]
struct Follow {
    /// Everything that can follow is [`end_only`].
    end_only: bool,
    /// Everything that can follow consumes at least one character.
    consumes: bool,
}

/// For strings ending with `\n`, `$`/`\Z` are emitted as `(?:\n?\z)` (which consumes that
/// `\n`) and multi-line `^` as `(?m:^)` (which also matches after it). Both are exact only
/// where checked here.
fn check_trailing_newline(node: &Node, follow: Follow) -> Result<(), &'static str> {
    match node {
        Node::Atom(_) => Ok(()),
        Node::Look(Look::EndOrFinalNewline) if !follow.end_only => {
            Err("`$` (without the m option) or `\\Z` followed by more pattern")
        }
        Node::Look(Look::LineStart) if !follow.consumes => {
            Err("multi-line `^` followed by a pattern that can match the empty string")
        }
        Node::Look(_) => Ok(()),
        Node::Concat(nodes) => {
            let mut f = follow;
            for n in nodes.iter().rev() {
                check_trailing_newline(n, f)?;
                f = Follow {
                    end_only: f.end_only && end_only(n),
                    consumes: f.consumes || min_len(n) >= 1,
                };
            }
            Ok(())
        }
        Node::Alt(nodes) => nodes
            .iter()
            .try_for_each(|n| check_trailing_newline(n, follow)),
        Node::Group(n) => check_trailing_newline(n, follow),
        Node::Repeat { node, max, .. } => {
            if max.is_some_and(|m| m <= 1) {
                return check_trailing_newline(node, follow);
            }
            // After one iteration comes either another one or what follows the repetition.
            check_trailing_newline(
                node,
                Follow {
                    end_only: follow.end_only && end_only(node),
                    consumes: follow.consumes && min_len(node) >= 1,
                },
            )
        }
    }
}

impl Regex {
    /// Compiles a PCRE `pattern` with MongoDB regex `options` (`i`, `m`, `s`, `x`, `u`).
    pub fn new(pattern: &str, options: &str) -> CommandResult<Regex> {
        let mut flags = Flags::default();
        for o in options.chars() {
            match o {
                'i' => flags.icase = true,
                'm' => flags.multiline = true,
                's' => flags.dotall = true,
                'x' => flags.extended = true,
                'u' => {}
                _ => {
                    return Err(CommandError::new(
                        51108,
                        "Location51108",
                        format!("invalid flag in regex options: {o}"),
                    ))
                }
            }
        }
        let mut p = Parser {
            chars: pattern.chars().collect(),
            pos: 0,
            pattern,
            captures: 0,
        };
        let tree = p.alternation(&mut flags)?;
        if p.pos != p.chars.len() {
            return Err(p.invalid("unmatched closing parenthesis"));
        }
        let compile = |trailing_newline: bool| {
            let mut text = String::new();
            emit(&tree, trailing_newline, &mut text);
            regex::Regex::new(&text).map_err(|e| invalid(&regex_error_detail(&e), pattern))
        };
        let plain = compile(false)?;
        let trailing_newline = if !newline_sensitive(&tree) {
            TrailingNewline::Plain
        } else {
            let follow = Follow {
                end_only: true,
                consumes: false,
            };
            match check_trailing_newline(&tree, follow) {
                Ok(()) => TrailingNewline::Own(compile(true)?),
                Err(why) => TrailingNewline::Refused(why),
            }
        };
        Ok(Regex {
            pattern: pattern.to_string(),
            options: options.to_string(),
            plain,
            trailing_newline,
        })
    }

    /// Compiles a BSON regular expression.
    pub fn from_bson(r: &bson::Regex) -> CommandResult<Regex> {
        Regex::new(&r.pattern, &r.options)
    }

    /// Does the pattern occur anywhere in `s`? Errors (51091) for the few patterns whose PCRE
    /// meaning cannot be reproduced on a string that ends with `\n`.
    pub fn is_match(&self, s: &str) -> CommandResult<bool> {
        if !s.ends_with('\n') {
            return Ok(self.plain.is_match(s));
        }
        match &self.trailing_newline {
            TrailingNewline::Plain => Ok(self.plain.is_match(s)),
            TrailingNewline::Own(re) => Ok(re.is_match(s)),
            TrailingNewline::Refused(why) => Err(unsupported(
                &format!("matching a string that ends with a newline against {why} is"),
                &self.pattern,
            )),
        }
    }

    /// Query semantics: strings and symbols are searched; a regex value matches a regex with
    /// the same pattern and options; other types never match.
    pub fn matches_value(&self, v: &bson::Bson) -> CommandResult<bool> {
        match v {
            bson::Bson::String(s) | bson::Bson::Symbol(s) => self.is_match(s),
            bson::Bson::RegularExpression(r) => {
                Ok(r.pattern == self.pattern && r.options == self.options)
            }
            _ => Ok(false),
        }
    }
}

#[cfg(test)]
#[path = "regex_tests.rs"]
mod tests;
