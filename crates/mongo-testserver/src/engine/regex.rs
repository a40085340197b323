//! A small backtracking regular-expression matcher for `$regex` and regex query values.
//!
//! Supported: literals, `.`, `^`, `$`, `\A`, `\z`, `\Z`, `\b`, `\B`, classes `[a-z]`, `[^...]`,
//! `\d \w \s \D \W \S`, escapes, groups `(...)` and `(?:...)`, alternation `|`, quantifiers
//! `* + ? {n} {n,} {n,m}` and their lazy forms; options `i`, `m`, `s`, `x`. Anything else
//! (backreferences, lookaround, named groups, Unicode properties) is refused with an error that
//! names it, never matched wrongly.

use std::cell::Cell;

use crate::error::{CommandError, CommandResult};

/// A compiled regular expression.
#[derive(Debug, Clone)]
pub struct Regex {
    pattern: String,
    options: String,
    alts: Vec<Vec<Node>>,
    icase: bool,
    multiline: bool,
    dotall: bool,
}

#[derive(Debug, Clone)]
enum Node {
    Char(char),
    Any,
    Class(Class),
    Start,
    End,
    TextStart,
    TextEnd,
    TextEndNewline,
    WordBoundary(bool),
    Group(Vec<Vec<Node>>),
    Repeat(Box<Node>, u32, Option<u32>, bool),
}

#[derive(Debug, Clone)]
struct Class {
    negated: bool,
    items: Vec<ClassItem>,
}

#[derive(Debug, Clone)]
enum ClassItem {
    Range(char, char),
    Digit(bool),
    Word(bool),
    Space(bool),
}

fn unsupported(what: &str, pattern: &str) -> CommandError {
    CommandError::new(
        51091,
        "Location51091",
        format!("Regular expression is invalid or unsupported by mongo-testserver: {what} in /{pattern}/"),
    )
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

impl ClassItem {
    fn matches(&self, c: char, icase: bool) -> bool {
        match self {
            ClassItem::Range(a, b) => {
                let within = |x: char| *a <= x && x <= *b;
                within(c)
                    || (icase && (c.to_lowercase().any(within) || c.to_uppercase().any(within)))
            }
            ClassItem::Digit(pos) => c.is_ascii_digit() == *pos,
            ClassItem::Word(pos) => is_word(c) == *pos,
            ClassItem::Space(pos) => c.is_whitespace() == *pos,
        }
    }
}

struct Parser<'a> {
    chars: Vec<char>,
    pos: usize,
    pattern: &'a str,
    extended: bool,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn skip_extended(&mut self) {
        if !self.extended {
            return;
        }
        while let Some(c) = self.peek() {
            if c.is_whitespace() {
                self.pos += 1;
            } else if c == '#' {
                while let Some(c) = self.peek() {
                    self.pos += 1;
                    if c == '\n' {
                        break;
                    }
                }
            } else {
                break;
            }
        }
    }

    fn alternation(&mut self) -> CommandResult<Vec<Vec<Node>>> {
        let mut alts = vec![self.sequence()?];
        while self.peek() == Some('|') {
            self.pos += 1;
            alts.push(self.sequence()?);
        }
        Ok(alts)
    }

    fn sequence(&mut self) -> CommandResult<Vec<Node>> {
        let mut seq = Vec::new();
        loop {
            self.skip_extended();
            let Some(c) = self.peek() else { break };
            if c == '|' || c == ')' {
                break;
            }
            let atom = self.atom()?;
            self.skip_extended();
            let node = self.quantifier(atom)?;
            seq.push(node);
        }
        Ok(seq)
    }

    fn number(&mut self) -> Option<u32> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if start == self.pos {
            return None;
        }
        self.chars[start..self.pos]
            .iter()
            .collect::<String>()
            .parse()
            .ok()
    }

    fn quantifier(&mut self, atom: Node) -> CommandResult<Node> {
        let (min, max) = match self.peek() {
            Some('*') => {
                self.pos += 1;
                (0, None)
            }
            Some('+') => {
                self.pos += 1;
                (1, None)
            }
            Some('?') => {
                self.pos += 1;
                (0, Some(1))
            }
            Some('{') => {
                let save = self.pos;
                self.pos += 1;
                let Some(min) = self.number() else {
                    self.pos = save;
                    return Ok(atom);
                };
                let max = if self.peek() == Some(',') {
                    self.pos += 1;
                    self.number()
                } else {
                    Some(min)
                };
                if self.peek() != Some('}') {
                    self.pos = save;
                    return Ok(atom);
                }
                self.pos += 1;
                if max.is_some_and(|m| m < min) {
                    return Err(unsupported(
                        "numbers out of order in {} quantifier",
                        self.pattern,
                    ));
                }
                (min, max)
            }
            _ => return Ok(atom),
        };
        if matches!(
            atom,
            Node::Start
                | Node::End
                | Node::TextStart
                | Node::TextEnd
                | Node::TextEndNewline
                | Node::WordBoundary(_)
        ) {
            return Err(unsupported("quantifier on an anchor", self.pattern));
        }
        let greedy = if self.peek() == Some('?') {
            self.pos += 1;
            false
        } else if self.peek() == Some('+') {
            return Err(unsupported("possessive quantifier", self.pattern));
        } else {
            true
        };
        if matches!(self.peek(), Some('*' | '+')) {
            return Err(unsupported("nothing to repeat", self.pattern));
        }
        Ok(Node::Repeat(Box::new(atom), min, max, greedy))
    }

    fn atom(&mut self) -> CommandResult<Node> {
        let c = self.peek().unwrap_or('\0');
        self.pos += 1;
        match c {
            '.' => Ok(Node::Any),
            '^' => Ok(Node::Start),
            '$' => Ok(Node::End),
            '(' => {
                if self.peek() == Some('?') {
                    if self.chars.get(self.pos + 1) == Some(&':') {
                        self.pos += 2;
                    } else {
                        return Err(unsupported(
                            "(? group syntax (lookaround, named group, inline flags)",
                            self.pattern,
                        ));
                    }
                }
                let alts = self.alternation()?;
                if self.peek() != Some(')') {
                    return Err(unsupported("missing )", self.pattern));
                }
                self.pos += 1;
                Ok(Node::Group(alts))
            }
            '[' => self.class(),
            '\\' => self.escape(false).map(|e| match e {
                Esc::Node(n) => n,
                Esc::Item(i) => Node::Class(Class {
                    negated: false,
                    items: vec![i],
                }),
            }),
            '*' | '+' | '?' => Err(unsupported("nothing to repeat", self.pattern)),
            ')' => Err(unsupported("unmatched )", self.pattern)),
            other => Ok(Node::Char(other)),
        }
    }

    fn escape(&mut self, in_class: bool) -> CommandResult<Esc> {
        let Some(c) = self.peek() else {
            return Err(unsupported("\\ at end of pattern", self.pattern));
        };
        self.pos += 1;
        let item = |i| Ok(Esc::Item(i));
        match c {
            'd' => item(ClassItem::Digit(true)),
            'D' => item(ClassItem::Digit(false)),
            'w' => item(ClassItem::Word(true)),
            'W' => item(ClassItem::Word(false)),
            's' => item(ClassItem::Space(true)),
            'S' => item(ClassItem::Space(false)),
            'n' => Ok(Esc::Node(Node::Char('\n'))),
            't' => Ok(Esc::Node(Node::Char('\t'))),
            'r' => Ok(Esc::Node(Node::Char('\r'))),
            'f' => Ok(Esc::Node(Node::Char('\x0c'))),
            'v' => Ok(Esc::Node(Node::Char('\x0b'))),
            '0' => Ok(Esc::Node(Node::Char('\0'))),
            'b' if !in_class => Ok(Esc::Node(Node::WordBoundary(true))),
            'B' if !in_class => Ok(Esc::Node(Node::WordBoundary(false))),
            'A' if !in_class => Ok(Esc::Node(Node::TextStart)),
            'z' if !in_class => Ok(Esc::Node(Node::TextEnd)),
            'Z' if !in_class => Ok(Esc::Node(Node::TextEndNewline)),
            'x' => {
                let hex: String = self.chars.iter().skip(self.pos).take(2).collect();
                let v = u32::from_str_radix(&hex, 16)
                    .ok()
                    .and_then(char::from_u32)
                    .filter(|_| hex.len() == 2)
                    .ok_or_else(|| unsupported("\\x escape", self.pattern))?;
                self.pos += 2;
                Ok(Esc::Node(Node::Char(v)))
            }
            c if c.is_ascii_alphanumeric() => {
                Err(unsupported(&format!("escape \\{c}"), self.pattern))
            }
            other => Ok(Esc::Node(Node::Char(other))),
        }
    }

    fn class(&mut self) -> CommandResult<Node> {
        let mut negated = false;
        if self.peek() == Some('^') {
            negated = true;
            self.pos += 1;
        }
        let mut items = Vec::new();
        let mut first = true;
        loop {
            let Some(c) = self.peek() else {
                return Err(unsupported("missing ]", self.pattern));
            };
            if c == ']' && !first {
                self.pos += 1;
                break;
            }
            first = false;
            self.pos += 1;
            let lo = match c {
                '\\' => match self.escape(true)? {
                    Esc::Item(i) => {
                        items.push(i);
                        continue;
                    }
                    Esc::Node(Node::Char(ch)) => ch,
                    Esc::Node(_) => return Err(unsupported("escape in class", self.pattern)),
                },
                '[' if self.peek() == Some(':') => {
                    return Err(unsupported("POSIX class", self.pattern))
                }
                other => other,
            };
            if self.peek() == Some('-') && self.chars.get(self.pos + 1).is_some_and(|c| *c != ']') {
                self.pos += 1;
                let hc = self.peek().unwrap_or(lo);
                self.pos += 1;
                let hi = if hc == '\\' {
                    match self.escape(true)? {
                        Esc::Node(Node::Char(ch)) => ch,
                        _ => return Err(unsupported("class range", self.pattern)),
                    }
                } else {
                    hc
                };
                if hi < lo {
                    return Err(unsupported(
                        "range out of order in character class",
                        self.pattern,
                    ));
                }
                items.push(ClassItem::Range(lo, hi));
            } else {
                items.push(ClassItem::Range(lo, lo));
            }
        }
        Ok(Node::Class(Class { negated, items }))
    }
}

enum Esc {
    Node(Node),
    Item(ClassItem),
}

impl Regex {
    /// Compiles `pattern` with MongoDB regex `options` (`i`, `m`, `s`, `x`).
    pub fn new(pattern: &str, options: &str) -> CommandResult<Regex> {
        for o in options.chars() {
            if !matches!(o, 'i' | 'm' | 's' | 'x' | 'u') {
                return Err(CommandError::new(
                    51108,
                    "Location51108",
                    format!("invalid flag in regex options: {o}"),
                ));
            }
        }
        let mut p = Parser {
            chars: pattern.chars().collect(),
            pos: 0,
            pattern,
            extended: options.contains('x'),
        };
        let alts = p.alternation()?;
        if p.pos != p.chars.len() {
            return Err(unsupported("unmatched )", pattern));
        }
        Ok(Regex {
            pattern: pattern.to_string(),
            options: options.to_string(),
            alts,
            icase: options.contains('i'),
            multiline: options.contains('m'),
            dotall: options.contains('s'),
        })
    }

    /// Compiles a BSON regular expression.
    pub fn from_bson(r: &bson::Regex) -> CommandResult<Regex> {
        Regex::new(&r.pattern, &r.options)
    }

    /// Does the pattern occur anywhere in `s`? Errors (code 2) instead of answering when the
    /// search would backtrack too much or too deeply.
    pub fn is_match(&self, s: &str) -> CommandResult<bool> {
        let chars: Vec<char> = s.chars().collect();
        let m = Matcher {
            re: self,
            s: &chars,
            steps: Cell::new(0),
            depth: Cell::new(0),
            exhausted: Cell::new(false),
        };
        let found = (0..=chars.len()).any(|start| m.alts(&self.alts, start, &|_| true));
        if m.exhausted.get() {
            return Err(CommandError::bad_value(format!(
                "regular expression /{}/ is too expensive for mongo-testserver's matcher on this input",
                self.pattern
            )));
        }
        Ok(found)
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

struct Matcher<'a> {
    re: &'a Regex,
    s: &'a [char],
    steps: Cell<u64>,
    depth: Cell<u32>,
    exhausted: Cell<bool>,
}

const MAX_STEPS: u64 = 2_000_000;
const MAX_DEPTH: u32 = 1_000;

impl Matcher<'_> {
    fn alts(&self, alts: &[Vec<Node>], i: usize, k: &dyn Fn(usize) -> bool) -> bool {
        alts.iter().any(|seq| self.seq(seq, i, k))
    }

    fn seq(&self, seq: &[Node], i: usize, k: &dyn Fn(usize) -> bool) -> bool {
        if self.exhausted.get() {
            return false;
        }
        let steps = self.steps.get() + 1;
        self.steps.set(steps);
        if steps > MAX_STEPS || self.depth.get() > MAX_DEPTH {
            self.exhausted.set(true);
            return false;
        }
        self.depth.set(self.depth.get() + 1);
        let r = self.seq_inner(seq, i, k);
        self.depth.set(self.depth.get() - 1);
        r
    }

    fn seq_inner(&self, seq: &[Node], i: usize, k: &dyn Fn(usize) -> bool) -> bool {
        let Some((first, rest)) = seq.split_first() else {
            return k(i);
        };
        match first {
            Node::Repeat(node, min, max, greedy)
                if matches!(**node, Node::Char(_) | Node::Any | Node::Class(_)) =>
            {
                // A repeated single character: count how far it can go, then try the rest from
                // each end position (no recursion per character).
                let mut ends = vec![i];
                let mut j = i;
                while max.is_none_or(|m| (ends.len() as u64) <= u64::from(m)) {
                    match self.step(node, j) {
                        Some(n) => {
                            j = n;
                            ends.push(j);
                        }
                        None => break,
                    }
                }
                let min = *min as usize;
                if ends.len() <= min {
                    return false;
                }
                let candidates = &ends[min..];
                if *greedy {
                    candidates.iter().rev().any(|e| self.seq(rest, *e, k))
                } else {
                    candidates.iter().any(|e| self.seq(rest, *e, k))
                }
            }
            Node::Group(alts) => self.alts(alts, i, &|j| self.seq(rest, j, k)),
            Node::Repeat(node, min, max, greedy) => {
                self.repeat(node, *min, *max, *greedy, 0, i, &|j| self.seq(rest, j, k))
            }
            other => match self.step(other, i) {
                Some(j) => self.seq(rest, j, k),
                None => false,
            },
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn repeat(
        &self,
        node: &Node,
        min: u32,
        max: Option<u32>,
        greedy: bool,
        count: u32,
        i: usize,
        k: &dyn Fn(usize) -> bool,
    ) -> bool {
        let more = |this: &Self| {
            max.is_none_or(|m| count < m)
                && this.seq(std::slice::from_ref(node), i, &|j| {
                    // An empty iteration past the minimum would loop forever.
                    if j == i && count >= min {
                        return false;
                    }
                    this.repeat(node, min, max, greedy, count + 1, j, k)
                })
        };
        let stop = |_: &Self| count >= min && k(i);
        if greedy {
            if more(self) {
                return true;
            }
            return stop(self);
        }
        if stop(self) {
            return true;
        }
        more(self)
    }

    fn eq_char(&self, a: char, b: char) -> bool {
        a == b || (self.re.icase && a.to_lowercase().eq(b.to_lowercase()))
    }

    /// Matches one zero- or one-character node at `i`, returning the next position.
    fn step(&self, node: &Node, i: usize) -> Option<usize> {
        let c = self.s.get(i).copied();
        let at_word = |p: usize| p < self.s.len() && is_word(self.s[p]);
        match node {
            Node::Char(x) => c.filter(|c| self.eq_char(*c, *x)).map(|_| i + 1),
            Node::Any => c.filter(|c| self.re.dotall || *c != '\n').map(|_| i + 1),
            Node::Class(cl) => c
                .filter(|c| cl.items.iter().any(|it| it.matches(*c, self.re.icase)) != cl.negated)
                .map(|_| i + 1),
            Node::Start => (i == 0 || (self.re.multiline && self.s[i - 1] == '\n')).then_some(i),
            Node::End => (i == self.s.len()
                || (self.re.multiline && c == Some('\n'))
                || (i + 1 == self.s.len() && c == Some('\n')))
            .then_some(i),
            Node::TextStart => (i == 0).then_some(i),
            Node::TextEnd => (i == self.s.len()).then_some(i),
            Node::TextEndNewline => {
                (i == self.s.len() || (i + 1 == self.s.len() && c == Some('\n'))).then_some(i)
            }
            Node::WordBoundary(want) => {
                let b = (i > 0 && at_word(i - 1)) != at_word(i);
                (b == *want).then_some(i)
            }
            Node::Group(_) | Node::Repeat(..) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, o: &str, s: &str) -> bool {
        match Regex::new(p, o) {
            Ok(r) => r.is_match(s).unwrap_or_else(|e| panic!("{p}: {e}")),
            Err(e) => panic!("{p}: {e}"),
        }
    }

    #[test]
    fn basics() {
        assert!(m("abc", "", "xxabcxx"));
        assert!(!m("^abc", "", "xxabc"));
        assert!(m("^abc$", "", "abc"));
        assert!(m("a.c", "", "abc"));
        assert!(!m("a.c", "", "a\nc"));
        assert!(m("a.c", "s", "a\nc"));
        assert!(m("ABC", "i", "xabcx"));
        assert!(m("^b", "m", "a\nb"));
        assert!(!m("^b", "", "a\nb"));
        assert!(m("a b", "x", "ab"));
    }

    #[test]
    fn quantifiers_and_groups() {
        assert!(m("^a*b$", "", "aaab"));
        assert!(m("^a*b$", "", "b"));
        assert!(!m("^a+b$", "", "b"));
        assert!(m("^(ab)+$", "", "ababab"));
        assert!(!m("^(ab)+$", "", "ababa"));
        assert!(m("^a{2,3}$", "", "aaa"));
        assert!(!m("^a{2,3}$", "", "aaaa"));
        assert!(m("^a{2}$", "", "aa"));
        assert!(m("^(cat|dog)s?$", "", "dogs"));
        assert!(m("^(?:x|y)*z$", "", "xyxyz"));
        assert!(m("^(a*)*$", "", "aaaa"));
        assert!(m("^.*?b", "", "aab"));
        assert!(m("a{,2}", "", "a{,2}"));
    }

    #[test]
    fn classes() {
        assert!(m("^[a-c]+$", "", "abcab"));
        assert!(!m("^[a-c]+$", "", "abd"));
        assert!(m("^[^0-9]+$", "", "abc"));
        assert!(m("^\\d{3}-\\w+$", "", "123-ab_c"));
        assert!(m("^[A-Z]+$", "i", "abc"));
        assert!(m("\\bfoo\\b", "", "a foo b"));
        assert!(!m("\\bfoo\\b", "", "afoob"));
        assert!(m("^[.]$", "", "."));
        assert!(m("^[]a]+$", "", "]a"));
        assert!(m("^a\\.b$", "", "a.b"));
    }

    #[test]
    fn long_inputs_and_budget() {
        let long = "a".repeat(200_000);
        assert!(m("^a*$", "", &long));
        assert!(m("^.*a$", "", &long));
        assert!(m("^a+?$", "", &long));
        assert!(!m("^[b]*a{3}b", "", &long));
        let evil = Regex::new("^(a|aa)*$", "").map(|r| r.is_match(&format!("{}b", "a".repeat(60))));
        assert!(matches!(evil, Ok(Err(_)) | Ok(Ok(false))));
        // Deep backtracking is cut off before it can exhaust a 1 MiB thread stack.
        let t = std::thread::Builder::new().stack_size(1 << 20).spawn(|| {
            let deep = Regex::new("^(ab)*$", "").map(|r| r.is_match(&"ab".repeat(50_000)));
            matches!(deep, Ok(Err(_)) | Ok(Ok(true)))
        });
        assert!(t.is_ok_and(|h| h.join().unwrap_or(false)));
    }

    #[test]
    fn refused() {
        assert!(Regex::new("(?=a)", "").is_err());
        assert!(Regex::new("(a)\\1", "").is_err());
        assert!(Regex::new("(a", "").is_err());
        assert!(Regex::new("a)", "").is_err());
        assert!(Regex::new("*a", "").is_err());
        assert!(Regex::new("a", "q").is_err());
        assert!(Regex::new("[z-a]", "").is_err());
    }
}
