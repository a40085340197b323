use super::*;
use bson::{doc, DateTime, Regex as BsonRegex};

fn vars() -> Vars {
    Vars::new(DateTime::from_millis(1_000_000))
}

fn m(filter: Document, d: Document) -> bool {
    match Filter::parse(&filter) {
        Ok(f) => match f.matches(&d, &vars()) {
            Ok(b) => b,
            Err(e) => panic!("match error {e}"),
        },
        Err(e) => panic!("parse error {e} for {filter}"),
    }
}

fn parse_err(filter: Document) -> CommandError {
    match Filter::parse(&filter) {
        Ok(_) => panic!("expected parse error for {filter}"),
        Err(e) => e,
    }
}

#[test]
fn equality_and_paths() {
    assert!(m(doc! {"a": 1}, doc! {"a": 1}));
    assert!(m(doc! {"a": 1}, doc! {"a": 1.0}));
    assert!(m(doc! {"a": 1}, doc! {"a": 1i64}));
    assert!(!m(doc! {"a": 1}, doc! {"a": "1"}));
    assert!(m(doc! {"a.b": 1}, doc! {"a": {"b": 1}}));
    assert!(m(doc! {"a.b": 1}, doc! {"a": [{"b": 2}, {"b": 1}]}));
    assert!(m(doc! {"a": 2}, doc! {"a": [1, 2, 3]}));
    assert!(m(doc! {"a": [1, 2]}, doc! {"a": [1, 2]}));
    assert!(!m(doc! {"a": [1, 2]}, doc! {"a": [2, 1]}));
    assert!(m(doc! {"a": [1, 2]}, doc! {"a": [[1, 2], 3]}));
    assert!(m(doc! {"a.1": 2}, doc! {"a": [1, 2]}));
    assert!(m(doc! {"a.0.b": 5}, doc! {"a": [{"b": 5}]}));
    assert!(m(doc! {"a": {"b": 1}}, doc! {"a": {"b": 1}}));
    assert!(!m(doc! {"a": {"b": 1}}, doc! {"a": {"b": 1, "c": 2}}));
    assert!(!m(
        doc! {"a": {"b": 1, "c": 2}},
        doc! {"a": {"c": 2, "b": 1}}
    ));
    assert!(m(doc! {}, doc! {"x": 1}));
    assert!(m(doc! {"a": 1, "b": 2}, doc! {"a": 1, "b": 2}));
    assert!(!m(doc! {"a": 1, "b": 2}, doc! {"a": 1, "b": 3}));
}

#[test]
fn null_and_missing() {
    assert!(m(doc! {"a": Bson::Null}, doc! {}));
    assert!(m(doc! {"a": Bson::Null}, doc! {"a": Bson::Null}));
    assert!(!m(doc! {"a": Bson::Null}, doc! {"a": 0}));
    assert!(m(
        doc! {"a.b": Bson::Null},
        doc! {"a": [{"b": 1}, {"c": 1}]}
    ));
    assert!(m(doc! {"a": {"$ne": Bson::Null}}, doc! {"a": 1}));
    assert!(!m(doc! {"a": {"$ne": Bson::Null}}, doc! {}));
    assert!(m(doc! {"a": {"$gte": Bson::Null}}, doc! {}));
    assert!(!m(doc! {"a": {"$gt": Bson::Null}}, doc! {}));
    assert!(m(doc! {"a": {"$in": [Bson::Null]}}, doc! {}));
    assert!(!m(doc! {"a": {"$nin": [Bson::Null, 1]}}, doc! {}));
    assert!(m(
        doc! {"a": {"$eq": Bson::Null}},
        doc! {"a": [1, Bson::Null]}
    ));
}

#[test]
fn comparisons_are_type_bracketed() {
    assert!(m(doc! {"a": {"$gt": 5}}, doc! {"a": 6}));
    assert!(m(doc! {"a": {"$gt": 5}}, doc! {"a": 5.5}));
    assert!(!m(doc! {"a": {"$gt": 5}}, doc! {"a": "z"}));
    assert!(!m(doc! {"a": {"$lt": "a"}}, doc! {"a": 5}));
    assert!(m(doc! {"a": {"$gte": 5, "$lte": 5}}, doc! {"a": 5}));
    assert!(m(doc! {"a": {"$lt": 5}}, doc! {"a": [10, 3]}));
    assert!(!m(doc! {"a": {"$lt": 5}}, doc! {}));
    assert!(m(doc! {"a": {"$gt": Bson::MinKey}}, doc! {"a": "x"}));
    assert!(m(doc! {"a": {"$lt": Bson::MaxKey}}, doc! {"a": {"b": 1}}));
    let t = DateTime::from_millis(500);
    assert!(m(
        doc! {"exp": {"$lt": DateTime::from_millis(1000)}},
        doc! {"exp": t}
    ));
    assert!(!m(doc! {"exp": {"$lt": 1000}}, doc! {"exp": t}));
    assert!(m(doc! {"a": {"$gt": [1]}}, doc! {"a": [[2]]}));
}

#[test]
fn set_operators() {
    assert!(m(doc! {"a": {"$in": [1, 2]}}, doc! {"a": 2}));
    assert!(m(doc! {"a": {"$in": [1, 2]}}, doc! {"a": [5, 2]}));
    assert!(!m(doc! {"a": {"$in": []}}, doc! {"a": 2}));
    assert!(m(doc! {"a": {"$nin": [1, 2]}}, doc! {"a": 3}));
    assert!(m(doc! {"a": {"$nin": [1, 2]}}, doc! {}));
    assert!(!m(doc! {"a": {"$nin": [1, 2]}}, doc! {"a": [3, 1]}));
    assert!(m(doc! {"a": {"$ne": 1}}, doc! {"a": [2, 3]}));
    assert!(!m(doc! {"a": {"$ne": 1}}, doc! {"a": [1, 3]}));
    assert!(m(doc! {"a": {"$all": [1, 2]}}, doc! {"a": [2, 3, 1]}));
    assert!(!m(doc! {"a": {"$all": [1, 2]}}, doc! {"a": [2, 3]}));
    assert!(!m(doc! {"a": {"$all": []}}, doc! {"a": [2, 3]}));
    assert!(m(
        doc! {"a": {"$in": [BsonRegex { pattern: "^x".into(), options: String::new() }]}},
        doc! {"a": "xy"}
    ));
    assert_eq!(parse_err(doc! {"a": {"$in": 1}}).code, 2);
    assert_eq!(parse_err(doc! {"a": {"$in": [{"$gt": 1}]}}).code, 2);
}

#[test]
fn exists_type_size_mod() {
    assert!(m(doc! {"a": {"$exists": true}}, doc! {"a": Bson::Null}));
    assert!(!m(doc! {"a": {"$exists": true}}, doc! {}));
    assert!(m(doc! {"a": {"$exists": false}}, doc! {}));
    assert!(m(doc! {"a": {"$exists": 0}}, doc! {"b": 1}));
    assert!(!m(
        doc! {"a.b": {"$exists": false}},
        doc! {"a": [{"b": 1}, {"c": 1}]}
    ));
    assert!(m(doc! {"a": {"$type": "string"}}, doc! {"a": "x"}));
    assert!(m(doc! {"a": {"$type": 2}}, doc! {"a": "x"}));
    assert!(m(doc! {"a": {"$type": "number"}}, doc! {"a": 1i64}));
    assert!(m(doc! {"a": {"$type": ["bool", "int"]}}, doc! {"a": 1}));
    assert!(m(doc! {"a": {"$type": "array"}}, doc! {"a": [1]}));
    assert!(m(doc! {"a": {"$type": "int"}}, doc! {"a": [1]}));
    assert!(!m(doc! {"a": {"$type": "null"}}, doc! {}));
    assert!(m(
        doc! {"a": {"$type": "date"}},
        doc! {"a": DateTime::from_millis(0)}
    ));
    assert_eq!(parse_err(doc! {"a": {"$type": "nope"}}).code, 2);
    assert_eq!(parse_err(doc! {"a": {"$type": 99}}).code, 2);
    assert!(m(doc! {"a": {"$size": 2}}, doc! {"a": [1, 2]}));
    assert!(m(doc! {"a": {"$size": 1}}, doc! {"a": [[1, 2]]}));
    assert!(!m(doc! {"a": {"$size": 2}}, doc! {"a": [[1, 2]]}));
    assert!(!m(doc! {"a": {"$size": 0}}, doc! {}));
    assert_eq!(parse_err(doc! {"a": {"$size": -1}}).code, 2);
    assert_eq!(parse_err(doc! {"a": {"$size": 1.5}}).code, 2);
    assert!(m(doc! {"a": {"$mod": [4, 1]}}, doc! {"a": 9}));
    assert!(!m(doc! {"a": {"$mod": [4, 1]}}, doc! {"a": 8}));
    assert_eq!(parse_err(doc! {"a": {"$mod": [0, 1]}}).code, 2);
}

#[test]
fn logical() {
    assert!(m(
        doc! {"$and": [{"a": 1}, {"b": 2}]},
        doc! {"a": 1, "b": 2}
    ));
    assert!(!m(doc! {"$and": [{"a": 1}, {"b": 2}]}, doc! {"a": 1}));
    assert!(m(doc! {"$or": [{"a": 1}, {"b": 2}]}, doc! {"b": 2}));
    assert!(!m(doc! {"$or": [{"a": 1}, {"b": 2}]}, doc! {"c": 2}));
    assert!(m(doc! {"$nor": [{"a": 1}, {"b": 2}]}, doc! {"c": 2}));
    assert!(!m(doc! {"$nor": [{"a": 1}]}, doc! {"a": 1}));
    assert!(m(doc! {"a": {"$not": {"$gt": 5}}}, doc! {"a": 3}));
    assert!(m(doc! {"a": {"$not": {"$gt": 5}}}, doc! {}));
    assert!(m(doc! {"a": {"$not": {"$gt": 5}}}, doc! {"a": "x"}));
    assert!(!m(doc! {"a": {"$not": {"$gt": 5}}}, doc! {"a": [1, 6]}));
    assert!(m(
        doc! {"a": {"$not": BsonRegex { pattern: "^x".into(), options: String::new() }}},
        doc! {"a": "yx"}
    ));
    assert_eq!(parse_err(doc! {"$and": []}).code, 2);
    assert_eq!(parse_err(doc! {"$or": [1]}).code, 2);
    assert_eq!(parse_err(doc! {"a": {"$not": 5}}).code, 2);
    assert_eq!(parse_err(doc! {"a": {"$not": {}}}).code, 2);
    assert!(m(doc! {"$comment": "hi", "a": 1}, doc! {"a": 1}));
    assert!(m(doc! {"$alwaysTrue": 1}, doc! {}));
    assert!(!m(doc! {"$alwaysFalse": 1}, doc! {}));
}

#[test]
fn elem_match() {
    let d = doc! {"a": [{"x": 1, "y": 2}, {"x": 3, "y": 4}]};
    assert!(m(doc! {"a": {"$elemMatch": {"x": 3, "y": 4}}}, d.clone()));
    assert!(!m(doc! {"a": {"$elemMatch": {"x": 1, "y": 4}}}, d.clone()));
    assert!(m(doc! {"a": {"$elemMatch": {"x": {"$gt": 2}}}}, d.clone()));
    assert!(m(
        doc! {"a": {"$elemMatch": {"$or": [{"x": 9}, {"y": 2}]}}},
        d.clone()
    ));
    assert!(m(
        doc! {"b": {"$elemMatch": {"$gt": 2, "$lt": 5}}},
        doc! {"b": [1, 3, 9]}
    ));
    assert!(!m(
        doc! {"b": {"$elemMatch": {"$gt": 2, "$lt": 5}}},
        doc! {"b": [1, 9]}
    ));
    assert!(!m(doc! {"b": {"$elemMatch": {"$gt": 2}}}, doc! {"b": 3}));
    // Elements that are arrays are documents keyed by position; scalars never match.
    assert!(m(doc! {"b": {"$elemMatch": {}}}, doc! {"b": [1, [2]]}));
    assert!(!m(doc! {"b": {"$elemMatch": {}}}, doc! {"b": [1, "s"]}));
    assert!(m(
        doc! {"b": {"$elemMatch": {"1": 5}}},
        doc! {"b": [[4, 5]]}
    ));
    assert!(m(
        doc! {"b": {"$elemMatch": {"$ne": 1}}},
        doc! {"b": [1, 2]}
    ));
    assert!(m(
        doc! {"a": {"$all": [{"$elemMatch": {"x": 1}}, {"$elemMatch": {"x": 3}}]}},
        d
    ));
    assert_eq!(parse_err(doc! {"a": {"$elemMatch": 1}}).code, 2);
}

#[test]
fn regex() {
    assert!(m(doc! {"a": {"$regex": "^ab"}}, doc! {"a": "abc"}));
    assert!(m(
        doc! {"a": {"$regex": "^AB", "$options": "i"}},
        doc! {"a": "abc"}
    ));
    assert!(m(
        doc! {"a": BsonRegex { pattern: "c$".into(), options: String::new() }},
        doc! {"a": ["x", "abc"]}
    ));
    assert!(!m(doc! {"a": {"$regex": "^ab"}}, doc! {"a": 5}));
    assert_eq!(parse_err(doc! {"a": {"$options": "i"}}).code, 2);
    assert_eq!(parse_err(doc! {"a": {"$regex": 5}}).code, 2);
    assert!(Filter::parse(&doc! {"a": {"$regex": "(?<=x)"}}).is_err());
}

#[test]
fn expr() {
    let now = vars().now;
    assert!(m(
        doc! {"$expr": {"$lt": ["$exp", "$$NOW"]}},
        doc! {"exp": DateTime::from_millis(5)}
    ));
    assert!(!m(
        doc! {"$expr": {"$lt": ["$exp", "$$NOW"]}},
        doc! {"exp": now}
    ));
    assert!(m(
        doc! {"$expr": {"$eq": ["$a", "$b"]}},
        doc! {"a": 1, "b": 1.0}
    ));
    assert!(!m(doc! {"$expr": "$missing"}, doc! {}));
    assert!(m(
        doc! {"_id": "x", "$or": [{"$expr": {"$lt": ["$exp", "$$NOW"]}}, {"owner": "me"}]},
        doc! {"_id": "x", "exp": now, "owner": "me"}
    ));
    assert_eq!(parse_err(doc! {"$expr": {"$bogus": 1}}).code, 168);
    let f = Filter::parse(&doc! {"$expr": {"$divide": [1, 0]}});
    assert!(f.is_ok_and(|f| f.matches(&doc! {}, &vars()).is_err()));
}

#[test]
fn unknown_operators() {
    let e = parse_err(doc! {"a": {"$foo": 1}});
    assert_eq!(e.code, 2);
    assert_eq!(e.message, "unknown operator: $foo");
    let e = parse_err(doc! {"$foo": 1});
    assert_eq!(e.code, 2);
    assert!(e.message.starts_with("unknown top level operator: $foo"));
    assert!(parse_err(doc! {"$where": "true"})
        .message
        .contains("$where"));
    assert_eq!(parse_err(doc! {"a": {"$gt": 1, "b": 2}}).code, 2);
}

#[test]
fn id_equality_and_expr_detection() {
    let f = |d: Document| Filter::parse(&d).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(f(doc! {"_id": 5}).id_equality(), Some(&Bson::Int32(5)));
    assert_eq!(
        f(doc! {"_id": {"$eq": "x"}, "a": 1}).id_equality(),
        Some(&Bson::String("x".into()))
    );
    assert_eq!(
        f(doc! {"$and": [{"a": 1}, {"_id": 7}]}).id_equality(),
        Some(&Bson::Int32(7))
    );
    assert_eq!(f(doc! {"_id": {"$gt": 5}}).id_equality(), None);
    assert_eq!(f(doc! {"$or": [{"_id": 1}]}).id_equality(), None);
    assert_eq!(f(doc! {"a": 1}).id_equality(), None);
    assert!(f(doc! {"_id": 1, "$expr": true}).uses_expr());
    assert!(f(doc! {"$or": [{"$expr": true}]}).uses_expr());
    assert!(f(doc! {"a": {"$elemMatch": {"$expr": true}}}).uses_expr());
    assert!(!f(doc! {"_id": 1}).uses_expr());
    assert_eq!(
        f(doc! {"_id": 1, "$expr": true})
            .check_upsert_allowed()
            .map_err(|e| e.code),
        Err(224)
    );
}

#[test]
fn pull_conditions() {
    let v = vars();
    let c = |b: Bson| ElementCondition::parse(&b).unwrap_or_else(|e| panic!("{e}"));
    assert!(c(Bson::Int32(1))
        .matches(&Bson::Double(1.0), &v)
        .unwrap_or(false));
    assert!(c(Bson::Document(doc! {"$gt": 3}))
        .matches(&Bson::Int32(4), &v)
        .unwrap_or(false));
    assert!(!c(Bson::Document(doc! {"$gt": 3}))
        .matches(&Bson::Int32(2), &v)
        .unwrap_or(true));
    assert!(c(Bson::Document(doc! {"x": 1}))
        .matches(&Bson::Document(doc! {"x": 1, "y": 2}), &v)
        .unwrap_or(false));
    assert!(!c(Bson::Document(doc! {"x": 1}))
        .matches(&Bson::Int32(1), &v)
        .unwrap_or(true));
    assert!(c(Bson::Document(doc! {"$in": [1, 2]}))
        .matches(&Bson::Int32(2), &v)
        .unwrap_or(false));
}

#[test]
fn equality_field_extraction() {
    let e = equality_fields(&doc! {"_id": 1, "a.b": 2, "c": {"$gt": 1}, "d": {"$eq": 4}, "$and": [{"e": 5}], "f": {"$in": [6]}})
        .unwrap_or_default();
    let names: Vec<&str> = e.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, vec!["_id", "a.b", "d", "e", "f"]);
}

fn sample_values() -> Vec<Bson> {
    vec![
        Bson::Null,
        Bson::Int32(1),
        Bson::Int64(1),
        Bson::Double(1.5),
        Bson::Int32(2),
        Bson::String("1".into()),
        Bson::String("x".into()),
        Bson::Boolean(true),
        Bson::Array(vec![]),
        Bson::Array(vec![Bson::Int32(1), Bson::Int32(2)]),
        Bson::Array(vec![Bson::Null]),
        Bson::Document(doc! {"b": 1}),
        Bson::Document(doc! {}),
        Bson::DateTime(DateTime::from_millis(3)),
    ]
}

fn sample_docs() -> Vec<Document> {
    let mut out = vec![
        doc! {},
        doc! {"a": Bson::Null},
        doc! {"a": [{"b": 1}, {"c": 1}]},
    ];
    for v in sample_values() {
        out.push(doc! {"a": v.clone()});
        out.push(doc! {"a": [v.clone(), 7]});
        out.push(doc! {"a": {"b": v}});
    }
    out
}

#[test]
fn negations_are_complements() {
    for v in sample_values() {
        for d in sample_docs() {
            for path in ["a", "a.b"] {
                let pos = |f: Document| m(f, d.clone());
                let eq = pos(doc! {path: {"$eq": v.clone()}});
                assert_eq!(pos(doc! {path: {"$ne": v.clone()}}), !eq, "$ne {v} on {d}");
                let inn = pos(doc! {path: {"$in": [v.clone()]}});
                assert_eq!(inn, eq, "$in vs $eq {v} on {d}");
                assert_eq!(
                    pos(doc! {path: {"$nin": [v.clone()]}}),
                    !inn,
                    "$nin {v} on {d}"
                );
                for op in ["$gt", "$gte", "$lt", "$lte"] {
                    let p = pos(doc! {path: {op: v.clone()}});
                    assert_eq!(
                        pos(doc! {path: {"$not": {op: v.clone()}}}),
                        !p,
                        "$not {op} {v} on {d}"
                    );
                }
                let or = pos(doc! {"$or": [{path: v.clone()}, {"z": 1}]});
                assert_eq!(pos(doc! {"$nor": [{path: v.clone()}, {"z": 1}]}), !or);
                let ex = pos(doc! {path: {"$exists": true}});
                assert_eq!(pos(doc! {path: {"$exists": false}}), !ex);
            }
        }
    }
}

#[test]
fn plain_value_is_eq_and_comparisons_agree_with_compare() {
    for v in sample_values() {
        for d in sample_docs() {
            assert_eq!(
                m(doc! {"a": v.clone()}, d.clone()),
                m(doc! {"a": {"$eq": v.clone()}}, d.clone())
            );
            // On a scalar of the same type class, $gte == $gt || $eq.
            if let Some(x) = d.get("a") {
                if !matches!(x, Bson::Array(_))
                    && crate::engine::compare::type_rank(x) == crate::engine::compare::type_rank(&v)
                {
                    let gte = m(doc! {"a": {"$gte": v.clone()}}, d.clone());
                    let gt = m(doc! {"a": {"$gt": v.clone()}}, d.clone());
                    let eq = m(doc! {"a": v.clone()}, d.clone());
                    assert_eq!(gte, gt || eq, "{v} on {d}");
                    assert_eq!(gt, compare(x, &v) == Ordering::Greater, "{v} on {d}");
                }
            }
        }
    }
}

#[test]
fn range_comparisons_never_match_nan() {
    let nan = doc! {"a": f64::NAN};
    assert!(!m(doc! {"a": {"$lt": 10}}, nan.clone()));
    assert!(!m(doc! {"a": {"$gt": -10}}, nan.clone()));
    assert!(!m(doc! {"a": {"$gt": f64::NAN}}, nan.clone()));
    assert!(!m(doc! {"a": {"$lt": f64::NAN}}, doc! {"a": 1}));
    assert!(!m(doc! {"a": {"$gt": f64::NAN}}, doc! {"a": 1}));
    // Equality-style comparisons do match NaN.
    assert!(m(doc! {"a": {"$gte": f64::NAN}}, nan.clone()));
    assert!(m(doc! {"a": {"$lte": f64::NAN}}, nan.clone()));
    assert!(m(doc! {"a": f64::NAN}, nan.clone()));
    assert!(m(doc! {"a": {"$in": [f64::NAN]}}, nan.clone()));
    let dec_nan: bson::Decimal128 = "NaN".parse().unwrap();
    assert!(!m(doc! {"a": {"$lt": 10}}, doc! {"a": dec_nan}));
    assert!(m(doc! {"a": {"$gte": f64::NAN}}, doc! {"a": dec_nan}));
}

/// The position a match records (mongod's elemMatchKey), for `doc` matching `filter`.
fn key(filter: Document, d: Document) -> Option<usize> {
    let f = Filter::parse(&filter).unwrap_or_else(|e| panic!("parse error {e} for {filter}"));
    assert!(
        f.matches(&d, &vars()).unwrap_or(false),
        "{filter} should match {d}"
    );
    f.matched_array_position(&d, &vars())
        .unwrap_or_else(|e| panic!("{filter} on {d}: {e}"))
}

#[test]
fn matched_array_position_follows_mongod_elem_match_key() {
    // A leaf array: the index of the matching element.
    assert_eq!(key(doc! {"a": {"$gte": 2}}, doc! {"a": [1, 2, 3]}), Some(1));
    // No array traversed: nothing recorded.
    assert_eq!(key(doc! {"a": 2}, doc! {"a": 2}), None);
    // The whole array equal: no position.
    assert_eq!(key(doc! {"a": [1, 2]}, doc! {"a": [1, 2]}), None);
    // Through documents in an array: the index in the outermost array.
    let nested = doc! {"a": [{"b": [{"c": 1}]}, {"b": [{"c": 7}, {"c": 5}]}]};
    assert_eq!(key(doc! {"a.b.c": 5}, nested.clone()), Some(1));
    // `$elemMatch` on the array itself: its matching element; under an outer array, the
    // outer index.
    assert_eq!(
        key(
            doc! {"a": {"$elemMatch": {"b": {"$size": 2}}}},
            nested.clone()
        ),
        Some(1)
    );
    assert_eq!(key(doc! {"a.b": {"$elemMatch": {"c": 5}}}, nested), Some(1));
    // Conjuncts are sorted by operator kind then path; the last one recording wins.
    let d = doc! {"a": [0, 5, 9], "b": [3, 4, 3]};
    assert_eq!(key(doc! {"a": {"$gt": 1}, "b": 3}, d.clone()), Some(1));
    assert_eq!(key(doc! {"b": 3, "a": {"$gt": 8}}, d.clone()), Some(2));
    assert_eq!(key(doc! {"b": 4, "a": 0}, d.clone()), Some(1));
    // `$or`, `$nor`, negations and `$expr` record nothing; a one-clause `$or` is its clause.
    assert_eq!(key(doc! {"$or": [{"a": 5}, {"x": 1}]}, d.clone()), None);
    assert_eq!(key(doc! {"$or": [{"a": 5}]}, d.clone()), Some(1));
    assert_eq!(key(doc! {"a": {"$ne": 7}}, d.clone()), None);
    assert_eq!(key(doc! {"a": {"$nin": [7]}, "b": 4}, d.clone()), Some(1));
    // `$all` items are conjuncts; a one-value `$in` is an equality.
    assert_eq!(key(doc! {"a": {"$all": [5, 9]}}, d.clone()), Some(2));
    assert_eq!(key(doc! {"a": {"$in": [9]}, "b": 4}, d), Some(1));
}
