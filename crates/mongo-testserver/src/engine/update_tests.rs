use super::*;
use bson::{doc, DateTime};

fn now() -> DateTime {
    DateTime::from_millis(1_700_000_000_000)
}

fn vars() -> Vars {
    Vars::new(now())
}

fn parse(u: Bson) -> Update {
    Update::parse(&u).unwrap_or_else(|e| panic!("parse {u}: {e}"))
}

/// Applies and returns (result, modified).
fn run(u: Bson, d: Document) -> (Document, bool) {
    run_insert(u, d, false)
}

fn run_insert(u: Bson, mut d: Document, is_insert: bool) -> (Document, bool) {
    let up = parse(u);
    let out = up
        .apply(&mut d, is_insert, &vars())
        .unwrap_or_else(|e| panic!("apply: {e}"));
    (d, out.modified)
}

fn apply_err(u: Bson, d: Document) -> CommandError {
    let up = parse(u);
    let mut work = d.clone();
    match up.apply(&mut work, false, &vars()) {
        Ok(_) => panic!("expected error, got {work}"),
        Err(e) => {
            assert_eq!(work, d, "document must be unchanged on error");
            e
        }
    }
}

fn parse_err(u: Bson) -> CommandError {
    match Update::parse(&u) {
        Ok(_) => panic!("expected parse error for {u}"),
        Err(e) => e,
    }
}

fn b(d: Document) -> Bson {
    Bson::Document(d)
}

#[test]
fn set_and_unset() {
    assert_eq!(
        run(b(doc! {"$set": {"a": 2}}), doc! {"_id": 1, "a": 1}),
        (doc! {"_id": 1, "a": 2}, true)
    );
    assert_eq!(
        run(b(doc! {"$set": {"a": 1}}), doc! {"_id": 1, "a": 1}),
        (doc! {"_id": 1, "a": 1}, false)
    );
    assert!(run(b(doc! {"$set": {"a": 1.0}}), doc! {"_id": 1, "a": 1}).1);
    assert_eq!(
        run(b(doc! {"$set": {"x.y.z": 1}}), doc! {"_id": 1}),
        (doc! {"_id": 1, "x": {"y": {"z": 1}}}, true)
    );
    assert_eq!(
        run(b(doc! {"$set": {"b": 1, "a": 1}}), doc! {"_id": 1}).0,
        doc! {"_id": 1, "a": 1, "b": 1}
    );
    assert_eq!(
        run(
            b(doc! {"$set": {"arr.1": 9}}),
            doc! {"_id": 1, "arr": [1, 2, 3]}
        )
        .0,
        doc! {"_id": 1, "arr": [1, 9, 3]}
    );
    assert_eq!(
        run(b(doc! {"$set": {"arr.4": 9}}), doc! {"_id": 1, "arr": [1]}).0,
        doc! {"_id": 1, "arr": [1, Bson::Null, Bson::Null, Bson::Null, 9]}
    );
    assert_eq!(
        run(
            b(doc! {"$set": {"arr.0.b": 9}}),
            doc! {"_id": 1, "arr": [{"a": 1}]}
        )
        .0,
        doc! {"_id": 1, "arr": [{"a": 1, "b": 9}]}
    );
    assert_eq!(
        apply_err(b(doc! {"$set": {"a.b": 1}}), doc! {"_id": 1, "a": 5}).code,
        28
    );
    assert_eq!(
        apply_err(b(doc! {"$set": {"a.b": 1}}), doc! {"_id": 1, "a": [1]}).code,
        28
    );
    assert_eq!(
        apply_err(
            b(doc! {"$set": {"a.b": 1}}),
            doc! {"_id": 1, "a": Bson::Null}
        )
        .code,
        28
    );
    assert_eq!(
        run(
            b(doc! {"$unset": {"a": ""}}),
            doc! {"_id": 1, "a": 1, "b": 2}
        ),
        (doc! {"_id": 1, "b": 2}, true)
    );
    assert_eq!(
        run(b(doc! {"$unset": {"zz": 1}}), doc! {"_id": 1}),
        (doc! {"_id": 1}, false)
    );
    assert_eq!(
        run(b(doc! {"$unset": {"a.b": 1}}), doc! {"_id": 1, "a": 5}),
        (doc! {"_id": 1, "a": 5}, false)
    );
    assert_eq!(
        run(
            b(doc! {"$unset": {"a.1": 1}}),
            doc! {"_id": 1, "a": [1, 2, 3]}
        )
        .0,
        doc! {"_id": 1, "a": [1, Bson::Null, 3]}
    );
    assert!(!run(b(doc! {"$set": {}}), doc! {"_id": 1}).1);
}

#[test]
fn inc_and_mul() {
    assert_eq!(
        run(b(doc! {"$inc": {"n": 1}}), doc! {"_id": 1, "n": 1}).0,
        doc! {"_id": 1, "n": 2}
    );
    assert_eq!(
        run(b(doc! {"$inc": {"n": 5i64}}), doc! {"_id": 1}).0,
        doc! {"_id": 1, "n": 5i64}
    );
    assert_eq!(
        run(b(doc! {"$inc": {"n": 1}}), doc! {"_id": 1, "n": i32::MAX}).0,
        doc! {"_id": 1, "n": i64::from(i32::MAX) + 1}
    );
    assert_eq!(
        run(b(doc! {"$inc": {"n": 0.5}}), doc! {"_id": 1, "n": 1}).0,
        doc! {"_id": 1, "n": 1.5}
    );
    assert!(!run(b(doc! {"$inc": {"n": 0}}), doc! {"_id": 1, "n": 1}).1);
    assert_eq!(
        run(b(doc! {"$inc": {"a.b": 1}}), doc! {"_id": 1}).0,
        doc! {"_id": 1, "a": {"b": 1}}
    );
    let e = apply_err(b(doc! {"$inc": {"n": 1}}), doc! {"_id": 1, "n": "x"});
    assert_eq!(e.code, 14);
    assert!(e.message.contains("non-numeric"), "{}", e.message);
    assert_eq!(
        apply_err(b(doc! {"$inc": {"n": 1}}), doc! {"_id": 1, "n": i64::MAX}).code,
        2
    );
    assert_eq!(parse_err(b(doc! {"$inc": {"n": "x"}})).code, 14);
    assert_eq!(
        run(b(doc! {"$mul": {"n": 3}}), doc! {"_id": 1, "n": 2}).0,
        doc! {"_id": 1, "n": 6}
    );
    assert_eq!(
        run(b(doc! {"$mul": {"n": 3i64}}), doc! {"_id": 1}).0,
        doc! {"_id": 1, "n": 0i64}
    );
    assert_eq!(
        run(b(doc! {"$mul": {"n": 2.0}}), doc! {"_id": 1}).0,
        doc! {"_id": 1, "n": 0.0}
    );
    assert_eq!(
        apply_err(b(doc! {"$mul": {"n": 2}}), doc! {"_id": 1, "n": true}).code,
        14
    );
}

#[test]
fn min_max_current_date() {
    assert_eq!(
        run(b(doc! {"$min": {"a": 3}}), doc! {"_id": 1, "a": 5}).0,
        doc! {"_id": 1, "a": 3}
    );
    assert_eq!(
        run(b(doc! {"$min": {"a": 7}}), doc! {"_id": 1, "a": 5}),
        (doc! {"_id": 1, "a": 5}, false)
    );
    assert_eq!(
        run(b(doc! {"$max": {"a": 7}}), doc! {"_id": 1, "a": 5}).0,
        doc! {"_id": 1, "a": 7}
    );
    assert_eq!(
        run(b(doc! {"$max": {"a": 7}}), doc! {"_id": 1}).0,
        doc! {"_id": 1, "a": 7}
    );
    assert_eq!(
        run(b(doc! {"$max": {"a": "s"}}), doc! {"_id": 1, "a": 5}).0,
        doc! {"_id": 1, "a": "s"}
    );
    assert_eq!(
        run(b(doc! {"$currentDate": {"t": true}}), doc! {"_id": 1}).0,
        doc! {"_id": 1, "t": now()}
    );
    assert_eq!(
        run(
            b(doc! {"$currentDate": {"t": {"$type": "date"}}}),
            doc! {"_id": 1}
        )
        .0,
        doc! {"_id": 1, "t": now()}
    );
    let (d, _) = run(
        b(doc! {"$currentDate": {"t": {"$type": "timestamp"}}}),
        doc! {"_id": 1},
    );
    assert!(matches!(d.get("t"), Some(Bson::Timestamp(t)) if t.time == 1_700_000_000));
    assert_eq!(
        parse_err(b(doc! {"$currentDate": {"t": {"$type": "x"}}})).code,
        2
    );
    assert_eq!(parse_err(b(doc! {"$currentDate": {"t": 1}})).code, 2);
}

#[test]
fn rename() {
    assert_eq!(
        run(b(doc! {"$rename": {"a": "b"}}), doc! {"_id": 1, "a": 1}).0,
        doc! {"_id": 1, "b": 1}
    );
    assert_eq!(
        run(
            b(doc! {"$rename": {"a": "x.y"}}),
            doc! {"_id": 1, "a": 1, "c": 2}
        )
        .0,
        doc! {"_id": 1, "c": 2, "x": {"y": 1}}
    );
    assert!(!run(b(doc! {"$rename": {"zz": "b"}}), doc! {"_id": 1}).1);
    assert_eq!(
        run(
            b(doc! {"$rename": {"a": "b"}}),
            doc! {"_id": 1, "a": 1, "b": 2}
        )
        .0,
        doc! {"_id": 1, "b": 1}
    );
    assert_eq!(parse_err(b(doc! {"$rename": {"a": "a"}})).code, 2);
    assert_eq!(parse_err(b(doc! {"$rename": {"a": 5}})).code, 2);
    assert_eq!(parse_err(b(doc! {"$rename": {"a": "a.b"}})).code, 2);
    assert_eq!(
        parse_err(b(doc! {"$rename": {"a": "b"}, "$set": {"b": 1}})).code,
        40
    );
    assert_eq!(
        apply_err(b(doc! {"$rename": {"a.0": "b"}}), doc! {"_id": 1, "a": [1]}).code,
        2
    );
}

#[test]
fn set_on_insert() {
    let u = b(doc! {"$setOnInsert": {"created": 1}, "$set": {"x": 1}});
    assert_eq!(run(u.clone(), doc! {"_id": 1}).0, doc! {"_id": 1, "x": 1});
    assert_eq!(
        run_insert(u, doc! {"_id": 1}, true).0,
        doc! {"_id": 1, "created": 1, "x": 1}
    );
}

#[test]
fn push_add_to_set_pop_pull() {
    assert_eq!(
        run(b(doc! {"$push": {"a": 3}}), doc! {"_id": 1, "a": [1]}).0,
        doc! {"_id": 1, "a": [1, 3]}
    );
    assert_eq!(
        run(b(doc! {"$push": {"a": 3}}), doc! {"_id": 1}).0,
        doc! {"_id": 1, "a": [3]}
    );
    assert_eq!(
        run(b(doc! {"$push": {"a": [3]}}), doc! {"_id": 1}).0,
        doc! {"_id": 1, "a": [[3]]}
    );
    assert_eq!(
        run(
            b(doc! {"$push": {"a": {"$each": [3, 4]}}}),
            doc! {"_id": 1, "a": [1]}
        )
        .0,
        doc! {"_id": 1, "a": [1, 3, 4]}
    );
    assert_eq!(
        run(
            b(doc! {"$push": {"a": {"$each": [3, 4], "$position": 0}}}),
            doc! {"_id": 1, "a": [1]}
        )
        .0,
        doc! {"_id": 1, "a": [3, 4, 1]}
    );
    assert_eq!(
        run(
            b(doc! {"$push": {"a": {"$each": [5], "$sort": -1, "$slice": 2}}}),
            doc! {"_id": 1, "a": [1, 9, 3]}
        )
        .0,
        doc! {"_id": 1, "a": [9, 5]}
    );
    assert_eq!(
        run(
            b(doc! {"$push": {"a": {"$each": [], "$slice": -1}}}),
            doc! {"_id": 1, "a": [1, 2]}
        )
        .0,
        doc! {"_id": 1, "a": [2]}
    );
    assert_eq!(
        run(
            b(doc! {"$push": {"a": {"$each": [{"s": 1}], "$sort": {"s": 1}}}}),
            doc! {"_id": 1, "a": [{"s": 3}, {"s": 2}]}
        )
        .0,
        doc! {"_id": 1, "a": [{"s": 1}, {"s": 2}, {"s": 3}]}
    );
    assert_eq!(
        apply_err(b(doc! {"$push": {"a": 1}}), doc! {"_id": 1, "a": 5}).code,
        2
    );
    assert_eq!(parse_err(b(doc! {"$push": {"a": {"$each": 1}}})).code, 2);
    assert_eq!(
        parse_err(b(doc! {"$push": {"a": {"$each": [1], "$bogus": 1}}})).code,
        2
    );
    assert_eq!(
        parse_err(b(doc! {"$push": {"a": {"$each": [1], "$sort": 2}}})).code,
        2
    );
    assert!(
        !run(
            b(doc! {"$addToSet": {"a": 1}}),
            doc! {"_id": 1, "a": [1, 2]}
        )
        .1
    );
    assert!(
        !run(
            b(doc! {"$addToSet": {"a": 1.0}}),
            doc! {"_id": 1, "a": [1, 2]}
        )
        .1
    );
    assert_eq!(
        run(
            b(doc! {"$addToSet": {"a": 3}}),
            doc! {"_id": 1, "a": [1, 2]}
        )
        .0,
        doc! {"_id": 1, "a": [1, 2, 3]}
    );
    assert_eq!(
        run(
            b(doc! {"$addToSet": {"a": {"$each": [2, 3, 3]}}}),
            doc! {"_id": 1, "a": [1, 2]}
        )
        .0,
        doc! {"_id": 1, "a": [1, 2, 3]}
    );
    assert_eq!(
        run(b(doc! {"$addToSet": {"a": {"$each": []}}}), doc! {"_id": 1}).0,
        doc! {"_id": 1, "a": []}
    );
    assert_eq!(
        apply_err(b(doc! {"$addToSet": {"a": 1}}), doc! {"_id": 1, "a": 1}).code,
        2
    );
    assert_eq!(
        parse_err(b(doc! {"$addToSet": {"a": {"$each": [1], "$slice": 1}}})).code,
        2
    );
    assert_eq!(
        run(b(doc! {"$pop": {"a": 1}}), doc! {"_id": 1, "a": [1, 2]}).0,
        doc! {"_id": 1, "a": [1]}
    );
    assert_eq!(
        run(b(doc! {"$pop": {"a": -1}}), doc! {"_id": 1, "a": [1, 2]}).0,
        doc! {"_id": 1, "a": [2]}
    );
    assert!(!run(b(doc! {"$pop": {"a": 1}}), doc! {"_id": 1}).1);
    assert_eq!(
        apply_err(b(doc! {"$pop": {"a": 1}}), doc! {"_id": 1, "a": 3}).code,
        14
    );
    assert_eq!(parse_err(b(doc! {"$pop": {"a": 2}})).code, 9);
    assert_eq!(
        run(
            b(doc! {"$pull": {"a": {"$gte": 2}}}),
            doc! {"_id": 1, "a": [1, 2, 3]}
        )
        .0,
        doc! {"_id": 1, "a": [1]}
    );
    assert_eq!(
        run(
            b(doc! {"$pull": {"a": 2}}),
            doc! {"_id": 1, "a": [1, 2, 2.0]}
        )
        .0,
        doc! {"_id": 1, "a": [1]}
    );
    assert_eq!(
        run(
            b(doc! {"$pull": {"a": {"k": "x"}}}),
            doc! {"_id": 1, "a": [{"k": "x", "v": 1}, {"k": "y"}]}
        )
        .0,
        doc! {"_id": 1, "a": [{"k": "y"}]}
    );
    assert_eq!(
        apply_err(b(doc! {"$pull": {"a": 1}}), doc! {"_id": 1, "a": 1}).code,
        2
    );
    assert_eq!(
        run(
            b(doc! {"$pullAll": {"a": [1, 3]}}),
            doc! {"_id": 1, "a": [1, 2, 3]}
        )
        .0,
        doc! {"_id": 1, "a": [2]}
    );
    assert_eq!(parse_err(b(doc! {"$pullAll": {"a": 1}})).code, 2);
}

#[test]
fn id_is_immutable() {
    assert_eq!(
        apply_err(b(doc! {"$set": {"_id": 2}}), doc! {"_id": 1}).code,
        66
    );
    assert!(!run(b(doc! {"$set": {"_id": 1}}), doc! {"_id": 1}).1);
    assert_eq!(
        apply_err(b(doc! {"$unset": {"_id": 1}}), doc! {"_id": 1}).code,
        66
    );
    assert_eq!(
        apply_err(b(doc! {"$set": {"_id.a": 2}}), doc! {"_id": {"a": 1}}).code,
        66
    );
    assert_eq!(
        apply_err(b(doc! {"_id": 2, "x": 1}), doc! {"_id": 1}).code,
        66
    );
    assert_eq!(
        apply_err(
            Bson::Array(vec![b(doc! {"$set": {"_id": 5}})]),
            doc! {"_id": 1}
        )
        .code,
        66
    );
    // An upsert inserting may set _id; it comes first.
    assert_eq!(
        run_insert(b(doc! {"$set": {"a": 1, "_id": 9}}), doc! {}, true).0,
        doc! {"_id": 9, "a": 1}
    );
}

#[test]
fn replacement() {
    let u = parse(b(doc! {"x": 1}));
    assert!(u.is_replacement());
    assert_eq!(
        run(b(doc! {"x": 1}), doc! {"_id": 1, "a": 2}),
        (doc! {"_id": 1, "x": 1}, true)
    );
    assert_eq!(
        run(b(doc! {"x": 1, "_id": 1}), doc! {"_id": 1, "a": 2}).0,
        doc! {"_id": 1, "x": 1}
    );
    assert!(!run(b(doc! {"_id": 1, "x": 1}), doc! {"_id": 1, "x": 1}).1);
    assert_eq!(run(b(doc! {}), doc! {"_id": 1, "x": 1}).0, doc! {"_id": 1});
    assert_eq!(
        run_insert(b(doc! {"x": 1}), doc! {"_id": 4}, true).0,
        doc! {"_id": 4, "x": 1}
    );
    assert_eq!(
        run_insert(b(doc! {"x": 1, "_id": 5}), doc! {}, true).0,
        doc! {"_id": 5, "x": 1}
    );
    assert_eq!(parse_err(b(doc! {"x": 1, "$set": {"a": 1}})).code, 52);
}

#[test]
fn pipeline_updates() {
    let u = Bson::Array(vec![b(doc! {"$set": {
        "token": {"$add": [{"$ifNull": ["$token", 0i64]}, 1]},
        "expiresAt": {"$add": ["$$NOW", 30000]},
        "owner": {"$cond": [{"$lt": ["$expiresAt", "$$NOW"]}, "me", "$owner"]},
    }})]);
    let (d, m) = run(
        u.clone(),
        doc! {"_id": "l", "token": 4i64, "expiresAt": DateTime::from_millis(0), "owner": "old"},
    );
    assert!(m);
    assert_eq!(
        d,
        doc! {"_id": "l", "token": 5i64, "expiresAt": DateTime::from_millis(now().timestamp_millis() + 30000), "owner": "me"}
    );
    let (d, _) = run_insert(u, doc! {"_id": "l"}, true);
    assert_eq!(d.get("token"), Some(&Bson::Int64(1)));
    assert_eq!(d.keys().next().map(String::as_str), Some("_id"));
    let u = Bson::Array(vec![
        b(doc! {"$replaceRoot": {"newRoot": "$t"}}),
        b(doc! {"$addFields": {"foo": 1}}),
    ]);
    assert_eq!(
        run(u, doc! {"_id": 1, "x": 1, "t": {"u": {"v": 1}}}).0,
        doc! {"_id": 1, "u": {"v": 1}, "foo": 1}
    );
    let u = Bson::Array(vec![
        b(doc! {"$project": {"x": 1}}),
        b(doc! {"$addFields": {"foo": 1}}),
    ]);
    assert_eq!(
        run(u, doc! {"_id": 1, "x": 1, "y": 1}).0,
        doc! {"_id": 1, "x": 1, "foo": 1}
    );
    let u = Bson::Array(vec![b(doc! {"$unset": ["x", "y"]})]);
    assert_eq!(run(u, doc! {"_id": 1, "x": 1, "y": 1}).0, doc! {"_id": 1});
    assert_eq!(
        run(Bson::Array(vec![]), doc! {"_id": 1, "x": 1}),
        (doc! {"_id": 1, "x": 1}, false)
    );
    let e = parse_err(Bson::Array(vec![b(doc! {"$match": {}})]));
    assert_eq!(e.code, 72);
    assert!(e.message.contains("$match"));
    assert_eq!(
        parse_err(Bson::Array(vec![b(doc! {"$bogus": {}})])).code,
        40324
    );
    assert_eq!(parse_err(Bson::Array(vec![Bson::Int32(1)])).code, 14);
    assert_eq!(
        parse_err(Bson::Array(vec![b(doc! {"$set": {"a": {"$bogus": 1}}})])).code,
        168
    );
    let e = apply_err(
        Bson::Array(vec![b(doc! {"$replaceWith": "$nope"})]),
        doc! {"_id": 1},
    );
    assert_eq!(e.code, 40228);
}

#[test]
fn parse_errors() {
    let e = parse_err(b(doc! {"$foo": {"a": 1}}));
    assert_eq!(e.code, 9);
    assert!(e.message.starts_with("Unknown modifier: $foo"));
    assert_eq!(parse_err(b(doc! {"$set": 1})).code, 9);
    assert_eq!(
        parse_err(b(doc! {"$set": {"a": 1}, "$inc": {"a": 1}})).code,
        40
    );
    assert_eq!(
        parse_err(b(doc! {"$set": {"a": 1}, "$unset": {"a.b": 1}})).code,
        40
    );
    assert_eq!(parse_err(b(doc! {"$set": {"a.b": 1, "a": 1}})).code, 40);
    assert!(Update::parse(&b(doc! {"$set": {"a.b": 1, "a.c": 1}})).is_ok());
    assert!(Update::parse(&b(doc! {"$set": {"ab": 1, "a": 1}})).is_ok());
    assert_eq!(parse_err(b(doc! {"$set": {"": 1}})).code, 56);
    assert_eq!(parse_err(b(doc! {"$set": {"a..b": 1}})).code, 56);
    // Positional paths parse (they are resolved when applied).
    assert!(Update::parse(&b(doc! {"$set": {"a.$": 1, "b.$[].c.$[x]": 1}})).is_ok());
    assert_eq!(parse_err(b(doc! {"$set": {"a.$.b.$": 1}})).code, 2);
    assert_eq!(parse_err(b(doc! {"$set": {"a.$[X]": 1}})).code, 2);
    // A positional element first (update_object_node.cpp: BadValue, not a `$` field name).
    assert_eq!(parse_err(b(doc! {"$set": {"$[]": 1}})).code, 2);
    assert_eq!(parse_err(b(doc! {"$set": {"$.a": 1}})).code, 2);
    assert_eq!(parse_err(b(doc! {"$set": {"$[x].a": 1}})).code, 2);
    // A top-level `$` field: stored by an upsert's insert, refused on a stored document.
    assert_eq!(
        run_insert(b(doc! {"$set": {"$a": 1}}), doc! {"_id": 1}, true).0,
        doc! {"_id": 1, "$a": 1}
    );
    assert_eq!(
        apply_err(b(doc! {"$set": {"$a.b": 1}}), doc! {"_id": 1}).code,
        52
    );
    assert_eq!(parse_err(b(doc! {"$inc": {"$a": 1}})).code, 52);
    assert_eq!(parse_err(b(doc! {"$set": {"a": 1}, "b": 1})).code, 9);
    assert_eq!(parse_err(Bson::Int32(1)).code, 9);
    assert!(parse_err(b(doc! {"$bit": {"a": {"and": 1}}}))
        .message
        .contains("$bit"));
}

#[test]
fn atomic_on_error() {
    // The first op succeeds, the second fails: nothing is applied.
    let e = apply_err(
        b(doc! {"$set": {"a": 5}, "$inc": {"b": 1}}),
        doc! {"_id": 1, "a": 1, "b": "x"},
    );
    assert_eq!(e.code, 14);
}

#[test]
fn seeds() {
    let s = |f: Document| upsert_seed(&f).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s(doc! {"_id": 1}), doc! {"_id": 1});
    assert_eq!(s(doc! {"a": 1, "_id": 2}), doc! {"_id": 2, "a": 1});
    assert_eq!(s(doc! {"a.b": 1, "a.c": 2}), doc! {"a": {"b": 1, "c": 2}});
    assert_eq!(s(doc! {"a": {"$eq": 1}, "b": {"$gt": 1}}), doc! {"a": 1});
    assert_eq!(
        s(doc! {"$and": [{"a": 1}, {"b": 2}], "c": 3}),
        doc! {"a": 1, "b": 2, "c": 3}
    );
    assert_eq!(
        s(doc! {"_id": "x", "$expr": {"$lt": ["$e", "$$NOW"]}}),
        doc! {"_id": "x"}
    );
    assert_eq!(s(doc! {"a": {"b": 1}}), doc! {"a": {"b": 1}});
    assert_eq!(s(doc! {"$or": [{"a": 1}, {"b": 1}]}), doc! {});
    assert_eq!(
        upsert_seed(&doc! {"$and": [{"a": 1}, {"a": 2}]}).map_err(|e| e.code),
        Err(54)
    );
    assert_eq!(
        upsert_seed(&doc! {"a": 1, "a.b": 2}).map_err(|e| e.code),
        Err(54)
    );
    assert_eq!(
        upsert_seed(&doc! {"_id.x": 1}).map_err(|e| e.code),
        Err(111)
    );
    // Seed + update as an upsert does it.
    let mut seed = s(doc! {"_id": 7, "name": "n"});
    let u = parse(b(doc! {"$inc": {"x": 1}, "$setOnInsert": {"c": true}}));
    let r = u.apply(&mut seed, true, &vars());
    assert!(r.is_ok());
    assert_eq!(seed, doc! {"_id": 7, "name": "n", "c": true, "x": 1});
}

#[test]
fn modified_flag_matches_document_change() {
    let docs = vec![
        doc! {"_id": 1},
        doc! {"_id": 1, "a": 1, "arr": [1, 2]},
        doc! {"_id": 1, "a": "s", "arr": 3},
        doc! {"_id": 1, "a": {"b": 1}, "arr": []},
    ];
    let updates = vec![
        b(doc! {"$set": {"a": 1}}),
        b(doc! {"$inc": {"a": 0}}),
        b(doc! {"$unset": {"a": 1}}),
        b(doc! {"$max": {"a": 0}}),
        b(doc! {"$push": {"arr": 1}}),
        b(doc! {"$addToSet": {"arr": 1}}),
        b(doc! {"$pull": {"arr": 1}}),
        b(doc! {"$pop": {"arr": 1}}),
        b(doc! {"$set": {"a.b": 1}}),
        b(doc! {"$rename": {"a": "z"}}),
        b(doc! {"x": 1}),
        Bson::Array(vec![b(doc! {"$set": {"a": {"$ifNull": ["$a", 0]}}})]),
    ];
    for d in &docs {
        for u in &updates {
            let up = parse(u.clone());
            let mut work = d.clone();
            match up.apply(&mut work, false, &vars()) {
                Ok(o) => {
                    assert_eq!(o.modified, work != *d, "{u} on {d}");
                    assert_eq!(work.keys().next().map(String::as_str), Some("_id"));
                }
                Err(_) => assert_eq!(work, *d, "{u} on {d} must leave the document unchanged"),
            }
        }
    }
}

#[test]
fn a_replacement_is_a_no_op_only_when_byte_identical() {
    let d = doc! {"_id": 1, "a": 1};
    // Without `_id` the replacement differs from the stored document: modified.
    let (out, modified) = run(b(doc! {"a": 1}), d.clone());
    assert!(modified);
    assert_eq!(out, d);
    assert!(!run(b(doc! {"_id": 1, "a": 1}), d.clone()).1);
    assert!(run(b(doc! {"_id": 1, "a": 1.0}), d.clone()).1);
    assert!(run(b(doc! {"_id": 1, "a": 1, "b": 2}), d).1);
}

#[test]
fn pull_with_operators_on_arrays_of_arrays() {
    let d = doc! {"_id": 1, "a": [[1, 2], [5, 6], [7]]};
    let (out, _) = run(
        b(doc! {"$pull": {"a": {"$elemMatch": {"$gte": 5}}}}),
        d.clone(),
    );
    assert_eq!(out, doc! {"_id": 1, "a": [[1, 2]]});
    let (out, _) = run(b(doc! {"$pull": {"a": {"$size": 1}}}), d.clone());
    assert_eq!(out, doc! {"_id": 1, "a": [[1, 2], [5, 6]]});
    let (out, _) = run(b(doc! {"$pull": {"a": [1, 2]}}), d.clone());
    assert_eq!(out, doc! {"_id": 1, "a": [[5, 6], [7]]});
    let (out, _) = run(b(doc! {"$pull": {"a": {"$in": [[7]]}}}), d.clone());
    assert_eq!(out, doc! {"_id": 1, "a": [[1, 2], [5, 6]]});
    // A value condition reaches into an element that is an array, as a query does.
    let (out, _) = run(b(doc! {"$pull": {"a": {"$gte": 6}}}), d.clone());
    assert_eq!(out, doc! {"_id": 1, "a": [[1, 2]]});
    // Equality compares whole elements.
    let (out, _) = run(b(doc! {"$pull": {"a": 7}}), d.clone());
    assert_eq!(out, d);
}
