use super::*;

fn m(p: &str, o: &str, s: &str) -> bool {
    match Regex::new(p, o) {
        Ok(r) => r.is_match(s).unwrap_or_else(|e| panic!("{p}: {e}")),
        Err(e) => panic!("{p}: {e}"),
    }
}

fn err(p: &str, o: &str) -> CommandError {
    match Regex::new(p, o) {
        Ok(r) => panic!("/{p}/{o} compiled: {r:?}"),
        Err(e) => e,
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
    assert!(m("", "", ""));
    assert!(m("é.", "i", "xÉü"));
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
    assert!(m("^a{2,}$", "", "aaaaa"));
    assert!(m("^(cat|dog)s?$", "", "dogs"));
    assert!(m("^(?:x|y)*z$", "", "xyxyz"));
    assert!(m("^(a*)*$", "", "aaaa"));
    assert!(m("^.*?b", "", "aab"));
    assert!(m("^a??b", "", "ab"));
    // `{` that does not start a quantifier is a literal, as in PCRE2.
    assert!(m("a{,2}", "", "a{,2}"));
    assert!(m("^x{a}$", "", "x{a}"));
    assert!(m("^{$", "", "{"));
    assert!(m("^a}$", "", "a}"));
    assert!(m(
        "^(?<year>\\d{4})-(?P<m>\\d\\d)-(?'d'\\d\\d)$",
        "",
        "2024-01-31"
    ));
    assert!(m("^(?|a|b)c$", "", "bc"));
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
    assert!(m("^[^]a]$", "", "b"));
    assert!(!m("^[^]a]$", "", "]"));
    assert!(m("^a\\.b$", "", "a.b"));
    // Characters that are special only to the `regex` crate are literals in PCRE.
    assert!(m("^[[&&~-]+$", "", "[&~-"));
    assert!(m("^a&&b~~c--d$", "", "a&&b~~c--d"));
    assert!(m("^\\<\\>$", "", "<>"));
    assert!(m("^[[:alpha:][:digit:]_]+$", "", "ab_12"));
    assert!(!m("^[[:^space:]]$", "", " "));
    assert!(m("^[[:upper:]]+$", "i", "aB"));
    assert!(m("^[\\w-]+$", "", "a-b"));
    assert!(m("^[\\d.]+$", "", "1.2"));
    assert!(m("^[\\Q]^\\E]+$", "", "]^"));
    assert!(m("^[\\x41-\\x{43}]+$", "", "ABC"));
    assert!(m("^[\\101]$", "", "A"));
}

#[test]
fn ascii_classes_like_pcre_without_ucp() {
    assert!(!m("^\\w$", "", "é"));
    assert!(m("^\\W$", "", "é"));
    assert!(!m("^\\d$", "", "٣"));
    assert!(!m("^\\s$", "", "\u{a0}"));
    assert!(m("^\\h$", "", "\u{a0}"));
    assert!(m("^\\v$", "", "\u{2028}"));
    assert!(m("^a\\N$", "", "ab"));
    assert!(!m("^a\\N$", "", "a\n"));
    // \b is an ASCII word boundary: é is not a word character.
    assert!(m("\\bcafé", "", " café"));
    assert!(!m("\\bcafé", "", "xcafé"));
    assert!(m("caf\\b", "", "café"));
    assert!(!m("café\\b", "", "café"));
    assert!(m("é\\B", "", "é"));
    // \p is Unicode and not case-folded under i (PCRE).
    assert!(m("^\\p{Greek}+$", "", "αβ"));
    assert!(m("^\\p{L&}$", "", "a"));
    assert!(!m("^\\p{Lu}$", "i", "a"));
    assert!(m("^\\P{Lu}$", "i", "a"));
}

#[test]
fn case_insensitive_fixed_sets() {
    // The Kelvin sign and long s fold to ASCII k and s, but are not in PCRE's ASCII \w.
    assert!(!m("^\\w$", "i", "\u{212A}"));
    assert!(!m("^[\\w]$", "i", "\u{212A}"));
    assert!(!m("^[\\w,]$", "i", "\u{17F}"));
    assert!(m("^[\\w,]$", "i", "K"));
    assert!(m("^[\\W]$", "i", "\u{212A}"));
    assert!(m("^[^\\W]$", "i", "k"));
    assert!(m("^[^\\W,]$", "i", "s"));
    assert!(!m("^[^\\W,]$", "i", ","));
    assert!(m("^[^\\w,]$", "i", "\u{212A}"));
    assert!(!m("^[^\\w,]$", "i", "k"));
    // ...unless a folded item includes them.
    assert!(!m("^[^\\d\\x{212A}]$", "i", "k"));
    assert!(!m("^[^\\d\\x{212A}]$", "i", "\u{212A}"));
    assert!(m("^[^\\dk]$", "i", "s"));
    assert!(!m("^[^\\dk]$", "i", "\u{212A}"));
    assert!(!m("^[^\\dk]$", "i", "K"));
}

#[test]
fn escapes() {
    assert!(m("^\\x41\\x{42}\\o{103}\\0$", "", "ABC\0"));
    assert!(m("^\\cA\\e\\a\\t$", "", "\x01\x1b\x07\t"));
    assert!(m("^\\Qa.b*\\E+$", "", "a.b**"));
    assert!(!m("^\\Qa.b*\\E$", "", "axb*"));
    assert!(m("^\\$\\^\\#\\ $", "", "$^# "));
    assert!(m("^\\é$", "", "é"));
    // \NNN: octal unless it could be a backreference (PCRE2's rule).
    assert!(m("^\\101\\0101$", "", "A\u{8}1"));
    assert!(m("^\\11$", "", "\t"));
    assert!(m("^\\1012$", "", "A2"));
    assert!(m("^[\\8\\9]+$", "", "89"));
}

#[test]
fn anchors_and_newlines() {
    // `$` (no m) and \Z: at the end or before a final newline.
    assert!(m("c$", "", "abc\n"));
    assert!(m("c\\Z", "", "abc\n"));
    assert!(!m("c\\z", "", "abc\n"));
    assert!(!m("c$", "", "abc\n\n"));
    assert!(!m("b$", "", "b\nc"));
    assert!(m("^abc$$", "", "abc\n"));
    assert!(m("^(abc$|x)$", "", "abc\n"));
    assert!(m("^(?:a$)?$", "", "\n"));
    assert!(m("\\Ax", "", "x\n"));
    assert!(!m("\\Ax", "", "\nx"));
    // With m: `$` before any newline, `^` after any newline that does not end the string.
    assert!(m("b$", "m", "b\nc"));
    assert!(m("^c", "m", "b\nc\n"));
    assert!(m("^$", "m", "a\n\nb"));
    assert!(m("^$", "m", ""));
    assert!(!m("^\\s*$", "m", "ab"));
    assert!(m("^\\s*$", "m", "ab\n \nc"));
    assert!(m("^b", "m", "a\nb\n"));
    assert!(!m("^b", "m", "a\nc\n"));
    // Where PCRE's meaning cannot be kept on a string that ends with a newline, matching one
    // is refused (and any other string is matched exactly).
    for (p, o, other) in [
        ("a$\\n", "", "ab"),
        ("^$", "m", "a\nb"),
        ("^\\s*$", "m", "a"),
    ] {
        let r = Regex::new(p, o).map_err(|e| e.to_string());
        let r = r.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.is_match(other).ok(), Some(false), "{p}");
        let e = r.is_match("a\n\n").err().map(|e| (e.code, e.message));
        assert!(
            matches!(&e, Some((51091, msg)) if msg.contains("newline")),
            "{p}: {e:?}"
        );
    }
}

#[test]
fn options() {
    // Unknown option letters: mongod's error 51108.
    let e = err("a", "q");
    assert_eq!(
        (e.code, e.message.as_str()),
        (51108, "invalid flag in regex options: q")
    );
    assert_eq!(err("a", "ig").code, 51108);
    assert!(!m("A", "u", "a"));
    assert!(m("A", "iu", "a"));
    // x: whitespace and # comments are ignored outside classes, kept inside them and escaped.
    assert!(m("^a b # comment\n c$", "x", "abc"));
    assert!(m("^a[ ]b\\ c$", "x", "a b c"));
    assert!(m("^a +$", "x", "aaa"));
    assert!(m("^a#b$", "", "a#b"));
    // Inline options, scoped to their group and to later branches of it.
    assert!(m("^a(?i)b$", "", "aB"));
    assert!(!m("^a(?i)b$", "", "AB"));
    assert!(m("^(?i:a)b$", "", "Ab"));
    assert!(!m("^(?i:a)b$", "", "AB"));
    assert!(m("^(?:a(?i)b|c)$", "", "C"));
    assert!(!m("^(?:(?i)a)b$", "", "aB"));
    assert!(m("^A(?-i)b$", "i", "ab"));
    assert!(!m("^A(?-i)b$", "i", "aB"));
    assert!(m("(?s)a.b", "", "a\nb"));
    assert!(m("(?m)^b", "", "a\nb"));
    assert!(m("(?x) a b ", "", "ab"));
    assert!(m("^(?^)a$", "i", "a"));
    assert!(!m("^(?^)a$", "i", "A"));
    assert!(m("^a(?#comment)b$", "", "ab"));
}

#[test]
fn long_inputs() {
    let long = "a".repeat(200_000);
    assert!(m("^a*$", "", &long));
    assert!(m("^.*a$", "", &long));
    assert!(m("^a+?$", "", &long));
    assert!(!m("^[b]*a{3}b", "", &long));
    // No backtracking: catastrophic patterns answer, exactly.
    assert!(!m("^(a|aa)*$", "", &format!("{}b", "a".repeat(60))));
    let t = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(|| Regex::new("^(ab)*$", "").and_then(|r| r.is_match(&"ab".repeat(50_000))));
    assert!(t.is_ok_and(|h| matches!(h.join(), Ok(Ok(true)))));
}

#[test]
fn refused() {
    for (p, what) in [
        ("(?=a)", "lookahead"),
        ("(?!a)", "lookahead"),
        ("(?<=a)", "lookbehind"),
        ("(?<!a)", "lookbehind"),
        ("(a)\\1", "backreferences"),
        ("\\1", "backreferences"),
        ("\\81", "backreferences"),
        ("((((((((((a))))))))))\\10", "backreferences"),
        ("(?<n>a)\\k<n>", "backreferences"),
        ("(a)\\g1", "backreferences"),
        ("(?P<n>a)(?P=n)", "backreferences"),
        ("(?>a)", "atomic"),
        ("a++", "possessive"),
        ("a{2}+", "possessive"),
        ("(a)(?1)", "recursion"),
        ("(?R)", "recursion"),
        ("(?(1)a|b)", "conditional"),
        ("(*UTF)a", "verbs"),
        ("\\Ga", "\\G"),
        ("a\\Kb", "\\K"),
        ("\\R", "\\R"),
        ("\\X", "\\X"),
        ("^*", "assertion"),
        ("[^\\p{Lu}a]", "\\p"),
    ] {
        let e = if what == "\\p" {
            err(p, "i")
        } else {
            err(p, "")
        };
        assert_eq!(e.code, 51091, "{p}");
        assert!(e.message.contains(what), "{p}: {}", e.message);
        assert!(
            e.message.starts_with("Regular expression is invalid"),
            "{p}"
        );
    }
    for p in [
        "(a",
        "a)",
        "*a",
        "a**",
        "[z-a]",
        "[a",
        "\\",
        "a{3,2}",
        "a{70000}",
        "\\q",
        "[\\d-z]",
        "\\p{NoSuchProperty}",
        "(?",
        "(?<n",
        "[[:nosuch:]]",
        "[[.a.]]",
    ] {
        assert_eq!(err(p, "").code, 51091, "{p}");
    }
}

#[test]
fn matches_value() {
    let r = Regex::new("^a", "i").map_err(|e| e.to_string());
    let r = r.unwrap_or_else(|e| panic!("{e}"));
    let t = |v: bson::Bson| r.matches_value(&v).unwrap_or_else(|e| panic!("{e}"));
    assert!(t(bson::Bson::String("Ab".into())));
    assert!(t(bson::Bson::Symbol("ab".into())));
    assert!(!t(bson::Bson::Int32(1)));
    assert!(t(bson::Bson::RegularExpression(bson::Regex {
        pattern: "^a".into(),
        options: "i".into(),
    })));
    assert!(!t(bson::Bson::RegularExpression(bson::Regex {
        pattern: "^a".into(),
        options: String::new(),
    })));
}
