use super::*;
use bson::{doc, oid::ObjectId};

fn now() -> DateTime {
    DateTime::from_millis(1_700_000_000_000)
}

fn ev(e: Bson, root: &Document) -> CommandResult<Option<Bson>> {
    evaluate(&e, root, &Vars::new(now()))
}

fn ok(e: Bson, root: &Document) -> Option<Bson> {
    match ev(e, root) {
        Ok(v) => v,
        Err(err) => panic!("unexpected error {err}"),
    }
}

fn val(e: Bson) -> Bson {
    ok(e, &doc! {}).unwrap_or(Bson::String("MISSING".into()))
}

fn err_code(e: Bson) -> i32 {
    match ev(e, &doc! {}) {
        Ok(v) => panic!("expected error, got {v:?}"),
        Err(err) => err.code,
    }
}

fn b(e: Document) -> Bson {
    Bson::Document(e)
}

#[test]
fn field_paths_and_variables() {
    let root = doc! {"_id": 1, "a": {"b": 2}, "arr": [{"x": 1}, {"y": 2}, {"x": 3}]};
    assert_eq!(ok(Bson::String("$a.b".into()), &root), Some(Bson::Int32(2)));
    assert_eq!(ok(Bson::String("$a.zz".into()), &root), None);
    assert_eq!(
        ok(Bson::String("$arr.x".into()), &root),
        Some(Bson::Array(vec![1.into(), 3.into()]))
    );
    assert_eq!(
        ok(Bson::String("$$NOW".into()), &root),
        Some(Bson::DateTime(now()))
    );
    assert_eq!(
        ok(Bson::String("$$ROOT".into()), &root),
        Some(Bson::Document(root.clone()))
    );
    assert_eq!(
        ok(Bson::String("$$CURRENT.a.b".into()), &root),
        Some(Bson::Int32(2))
    );
    assert_eq!(ok(Bson::String("$$REMOVE".into()), &root), None);
    assert_eq!(err_code(Bson::String("$$nope".into())), 17276);
    assert!(ev(Bson::String("$$CLUSTER_TIME".into()), &root).is_err());
    let vars = Vars::new(now()).with_let(doc! {"x": 5});
    assert_eq!(
        evaluate(&Bson::String("$$x".into()), &root, &vars).ok(),
        Some(Some(Bson::Int32(5)))
    );
    let ts = Timestamp {
        time: 5,
        increment: 1,
    };
    let vars = Vars::new(now()).with_cluster_time(ts);
    assert_eq!(
        evaluate(&Bson::String("$$CLUSTER_TIME".into()), &root, &vars).ok(),
        Some(Some(Bson::Timestamp(ts)))
    );
}

#[test]
fn literals_objects_arrays() {
    let root = doc! {"a": 1};
    assert_eq!(val(b(doc! {"$literal": "$a"})), Bson::String("$a".into()));
    assert_eq!(
        ok(b(doc! {"x": "$a", "y": "$missing"}), &root),
        Some(b(doc! {"x": 1}))
    );
    assert_eq!(
        ok(Bson::Array(vec!["$a".into(), "$missing".into()]), &root),
        Some(Bson::Array(vec![1.into(), Bson::Null]))
    );
    assert_eq!(err_code(b(doc! {"$add": [1], "$sub": 1})), 15983);
    assert_eq!(err_code(b(doc! {"$frobnicate": 1})), 168);
    assert_eq!(err_code(b(doc! {"a.b": 1})), 16412);
}

#[test]
fn add() {
    assert_eq!(val(b(doc! {"$add": [1, 2]})), Bson::Int32(3));
    assert_eq!(
        val(b(doc! {"$add": [i32::MAX, 1]})),
        Bson::Int64(i64::from(i32::MAX) + 1)
    );
    assert_eq!(val(b(doc! {"$add": [1i64, 2]})), Bson::Int64(3));
    assert_eq!(val(b(doc! {"$add": [1, 2.5]})), Bson::Double(3.5));
    assert_eq!(val(b(doc! {"$add": [1, Bson::Null]})), Bson::Null);
    assert_eq!(val(b(doc! {"$add": [1, "$missing"]})), Bson::Null);
    assert_eq!(val(b(doc! {"$add": []})), Bson::Int32(0));
    assert_eq!(
        val(b(doc! {"$add": ["$$NOW", 1000]})),
        Bson::DateTime(DateTime::from_millis(now().timestamp_millis() + 1000))
    );
    assert_eq!(
        val(b(doc! {"$add": [1000i64, "$$NOW", 0.4]})),
        Bson::DateTime(DateTime::from_millis(now().timestamp_millis() + 1000))
    );
    assert_eq!(err_code(b(doc! {"$add": ["$$NOW", "$$NOW"]})), 16612);
    assert_eq!(err_code(b(doc! {"$add": [1, "x"]})), 16554);
}

#[test]
fn subtract_multiply_divide() {
    assert_eq!(val(b(doc! {"$subtract": [5, 3]})), Bson::Int32(2));
    assert_eq!(val(b(doc! {"$subtract": [5, 0.5]})), Bson::Double(4.5));
    let d1 = DateTime::from_millis(5000);
    let d2 = DateTime::from_millis(2000);
    assert_eq!(val(b(doc! {"$subtract": [d1, d2]})), Bson::Int64(3000));
    assert_eq!(
        val(b(doc! {"$subtract": [d1, 1000]})),
        Bson::DateTime(DateTime::from_millis(4000))
    );
    assert_eq!(val(b(doc! {"$subtract": [Bson::Null, 1]})), Bson::Null);
    assert_eq!(err_code(b(doc! {"$subtract": [1, d1]})), 16556);
    assert_eq!(err_code(b(doc! {"$subtract": [1]})), 16020);
    assert_eq!(val(b(doc! {"$multiply": [2, 3, 4]})), Bson::Int32(24));
    assert_eq!(val(b(doc! {"$multiply": [2, 1.5]})), Bson::Double(3.0));
    assert_eq!(err_code(b(doc! {"$multiply": [2, "x"]})), 16555);
    assert_eq!(val(b(doc! {"$divide": [7, 2]})), Bson::Double(3.5));
    assert_eq!(err_code(b(doc! {"$divide": [7, 0]})), 2);
    assert_eq!(val(b(doc! {"$divide": [Bson::Null, 0]})), Bson::Null);
    assert_eq!(val(b(doc! {"$mod": [7, 3]})), Bson::Int32(1));
    assert_eq!(val(b(doc! {"$abs": -3})), Bson::Int32(3));
    assert_eq!(val(b(doc! {"$floor": 2.7})), Bson::Double(2.0));
    assert_eq!(val(b(doc! {"$ceil": 2.1})), Bson::Double(3.0));
    assert_eq!(val(b(doc! {"$pow": [2, 10]})), Bson::Int32(1024));
}

#[test]
fn comparisons() {
    assert_eq!(val(b(doc! {"$eq": [1, 1.0]})), Bson::Boolean(true));
    assert_eq!(
        val(b(doc! {"$eq": ["$missing", Bson::Null]})),
        Bson::Boolean(false)
    );
    assert_eq!(
        val(b(doc! {"$lt": ["$missing", Bson::Null]})),
        Bson::Boolean(true)
    );
    assert_eq!(val(b(doc! {"$gt": ["a", 5]})), Bson::Boolean(true));
    assert_eq!(val(b(doc! {"$lte": [5, 5]})), Bson::Boolean(true));
    assert_eq!(val(b(doc! {"$ne": [5, 6]})), Bson::Boolean(true));
    assert_eq!(val(b(doc! {"$gte": [4, 5]})), Bson::Boolean(false));
    assert_eq!(val(b(doc! {"$cmp": [4, 5]})), Bson::Int32(-1));
    assert_eq!(val(b(doc! {"$cmp": ["b", "a"]})), Bson::Int32(1));
    assert_eq!(err_code(b(doc! {"$eq": [1]})), 16020);
    let root = doc! {"exp": DateTime::from_millis(1)};
    assert_eq!(
        ok(b(doc! {"$lt": ["$exp", "$$NOW"]}), &root),
        Some(Bson::Boolean(true))
    );
}

#[test]
fn booleans_and_conditionals() {
    assert_eq!(val(b(doc! {"$and": [1, true, "x"]})), Bson::Boolean(true));
    assert_eq!(val(b(doc! {"$and": [1, 0]})), Bson::Boolean(false));
    assert_eq!(val(b(doc! {"$and": []})), Bson::Boolean(true));
    assert_eq!(
        val(b(doc! {"$or": [Bson::Null, "$missing"]})),
        Bson::Boolean(false)
    );
    assert_eq!(val(b(doc! {"$or": [0, [] ]})), Bson::Boolean(true));
    assert_eq!(val(b(doc! {"$not": [0]})), Bson::Boolean(true));
    assert_eq!(val(b(doc! {"$not": 1})), Bson::Boolean(false));
    assert_eq!(val(b(doc! {"$cond": [true, 1, 2]})), Bson::Int32(1));
    assert_eq!(
        val(b(doc! {"$cond": {"if": Bson::Null, "then": 1, "else": 2}})),
        Bson::Int32(2)
    );
    assert_eq!(err_code(b(doc! {"$cond": {"if": true, "then": 1}})), 17082);
    assert_eq!(err_code(b(doc! {"$cond": [true, 1]})), 16020);
    assert_eq!(
        err_code(b(
            doc! {"$cond": {"if": true, "then": 1, "else": 2, "x": 1}}
        )),
        17083
    );
    assert_eq!(
        val(b(doc! {"$ifNull": ["$missing", Bson::Null, 3]})),
        Bson::Int32(3)
    );
    assert_eq!(val(b(doc! {"$ifNull": [0, 3]})), Bson::Int32(0));
    assert_eq!(
        val(b(doc! {"$ifNull": ["$missing", "$alsoMissing"]})),
        Bson::String("MISSING".into())
    );
    assert_eq!(err_code(b(doc! {"$ifNull": [1]})), 1257300);
    assert_eq!(
        val(b(
            doc! {"$switch": {"branches": [{"case": false, "then": 1}, {"case": true, "then": 2}], "default": 3}}
        )),
        Bson::Int32(2)
    );
    assert_eq!(
        err_code(b(
            doc! {"$switch": {"branches": [{"case": false, "then": 1}]}}
        )),
        40066
    );
    assert_eq!(
        val(b(
            doc! {"$let": {"vars": {"x": 2}, "in": {"$add": ["$$x", 1]}}}
        )),
        Bson::Int32(3)
    );
}

#[test]
fn lock_style_pipeline_expressions() {
    // The kind of expression a lock acquisition uses: take over if expired or ours.
    let root =
        doc! {"_id": "lock", "expiresAt": DateTime::from_millis(1000), "token": 7i64, "owner": "a"};
    let e = b(doc! {"$cond": [
        {"$or": [{"$lt": [{"$ifNull": ["$expiresAt", DateTime::from_millis(0)]}, "$$NOW"]}, {"$eq": ["$owner", "b"]}]},
        {"$add": [{"$ifNull": ["$token", 0i64]}, 1]},
        "$token"
    ]});
    assert_eq!(ok(e.clone(), &root), Some(Bson::Int64(8)));
    assert_eq!(ok(e, &doc! {"_id": "lock"}), Some(Bson::Int64(1)));
    let e = b(doc! {"$add": ["$$NOW", 30000]});
    assert_eq!(
        ok(e, &root),
        Some(Bson::DateTime(DateTime::from_millis(
            now().timestamp_millis() + 30000
        )))
    );
}

#[test]
fn min_max_sum_avg() {
    assert_eq!(val(b(doc! {"$max": [1, 5, 3]})), Bson::Int32(5));
    assert_eq!(val(b(doc! {"$min": [1, Bson::Null, 3]})), Bson::Int32(1));
    assert_eq!(val(b(doc! {"$max": [[1, 7, 3]]})), Bson::Int32(7));
    assert_eq!(
        ok(b(doc! {"$max": "$a"}), &doc! {"a": [4, 9]}),
        Some(Bson::Int32(9))
    );
    assert_eq!(
        ok(b(doc! {"$min": "$a"}), &doc! {"a": 4}),
        Some(Bson::Int32(4))
    );
    assert_eq!(val(b(doc! {"$max": [Bson::Null, "$missing"]})), Bson::Null);
    assert_eq!(val(b(doc! {"$max": ["a", 5]})), Bson::String("a".into()));
    assert_eq!(val(b(doc! {"$sum": [1, 2, "x"]})), Bson::Int32(3));
    assert_eq!(
        ok(b(doc! {"$sum": "$a"}), &doc! {"a": [1, 2.5]}),
        Some(Bson::Double(3.5))
    );
    assert_eq!(val(b(doc! {"$avg": [1, 2]})), Bson::Double(1.5));
    assert_eq!(val(b(doc! {"$avg": ["x"]})), Bson::Null);
}

#[test]
fn types_and_conversions() {
    assert_eq!(val(b(doc! {"$type": 1})), Bson::String("int".into()));
    assert_eq!(
        val(b(doc! {"$type": "$missing"})),
        Bson::String("missing".into())
    );
    assert_eq!(val(b(doc! {"$type": [[1]]})), Bson::String("array".into()));
    assert_eq!(val(b(doc! {"$toLong": 5})), Bson::Int64(5));
    assert_eq!(val(b(doc! {"$toLong": "$missing"})), Bson::Null);
    assert_eq!(
        val(b(doc! {"$toLong": "$$NOW"})),
        Bson::Int64(now().timestamp_millis())
    );
    assert_eq!(err_code(b(doc! {"$toLong": "abc"})), 241);
    assert_eq!(val(b(doc! {"$toInt": "12"})), Bson::Int32(12));
    assert_eq!(val(b(doc! {"$toDouble": 2})), Bson::Double(2.0));
    assert_eq!(
        val(b(doc! {"$toDate": 0i64})),
        Bson::DateTime(DateTime::from_millis(0))
    );
    assert_eq!(val(b(doc! {"$toString": 12})), Bson::String("12".into()));
    assert_eq!(val(b(doc! {"$toBool": 0})), Bson::Boolean(false));
    let oid = ObjectId::new();
    assert_eq!(
        val(b(doc! {"$toObjectId": oid.to_hex()})),
        Bson::ObjectId(oid)
    );
    assert_eq!(val(b(doc! {"$isNumber": 1.5})), Bson::Boolean(true));
    assert_eq!(
        val(b(
            doc! {"$convert": {"input": "x", "to": "int", "onError": -1}}
        )),
        Bson::Int32(-1)
    );
    assert_eq!(
        val(b(
            doc! {"$convert": {"input": Bson::Null, "to": "int", "onNull": 0}}
        )),
        Bson::Int32(0)
    );
    assert_eq!(
        val(b(doc! {"$convert": {"input": "7", "to": 18}})),
        Bson::Int64(7)
    );
    assert_eq!(
        err_code(b(doc! {"$convert": {"input": "x", "to": "int"}})),
        241
    );
}

#[test]
fn arrays() {
    let root = doc! {"a": [1, 2, 3, 4], "n": Bson::Null};
    assert_eq!(ok(b(doc! {"$size": "$a"}), &root), Some(Bson::Int32(4)));
    assert_eq!(err_code(b(doc! {"$size": 1})), 17124);
    assert_eq!(err_code(b(doc! {"$size": "$missing"})), 17124);
    assert_eq!(
        ok(
            b(doc! {"$filter": {"input": "$a", "cond": {"$gt": ["$$this", 2]}}}),
            &root
        ),
        Some(Bson::Array(vec![3.into(), 4.into()]))
    );
    assert_eq!(
        ok(
            b(
                doc! {"$filter": {"input": "$a", "as": "x", "cond": {"$gt": ["$$x", 1]}, "limit": 2}}
            ),
            &root
        ),
        Some(Bson::Array(vec![2.into(), 3.into()]))
    );
    assert_eq!(
        ok(b(doc! {"$filter": {"input": "$n", "cond": true}}), &root),
        Some(Bson::Null)
    );
    assert_eq!(
        err_code(b(doc! {"$filter": {"input": 1, "cond": true}})),
        28651
    );
    assert_eq!(
        err_code(b(doc! {"$filter": {"input": [], "cond": true, "bogus": 1}})),
        9
    );
    assert_eq!(
        ok(
            b(doc! {"$map": {"input": "$a", "as": "v", "in": {"$multiply": ["$$v", 10]}}}),
            &root
        ),
        Some(Bson::Array(vec![
            10.into(),
            20.into(),
            30.into(),
            40.into()
        ]))
    );
    assert_eq!(
        ok(
            b(
                doc! {"$reduce": {"input": "$a", "initialValue": 0, "in": {"$add": ["$$value", "$$this"]}}}
            ),
            &root
        ),
        Some(Bson::Int32(10))
    );
    assert_eq!(
        val(b(doc! {"$concatArrays": [[1], [2, 3]]})),
        Bson::Array(vec![1.into(), 2.into(), 3.into()])
    );
    assert_eq!(
        val(b(doc! {"$concatArrays": [[1], "$missing"]})),
        Bson::Null
    );
    assert_eq!(err_code(b(doc! {"$concatArrays": [[1], 2]})), 28664);
    assert_eq!(
        ok(b(doc! {"$in": [2, "$a"]}), &root),
        Some(Bson::Boolean(true))
    );
    assert_eq!(
        ok(b(doc! {"$in": [2.0, "$a"]}), &root),
        Some(Bson::Boolean(true))
    );
    assert_eq!(
        ok(b(doc! {"$in": [9, "$a"]}), &root),
        Some(Bson::Boolean(false))
    );
    assert_eq!(err_code(b(doc! {"$in": [1, "$missing"]})), 40081);
    assert_eq!(
        ok(b(doc! {"$arrayElemAt": ["$a", 0]}), &root),
        Some(Bson::Int32(1))
    );
    assert_eq!(
        ok(b(doc! {"$arrayElemAt": ["$a", -1]}), &root),
        Some(Bson::Int32(4))
    );
    assert_eq!(ok(b(doc! {"$arrayElemAt": ["$a", 10]}), &root), None);
    assert_eq!(
        ok(b(doc! {"$arrayElemAt": ["$missing", 0]}), &root),
        Some(Bson::Null)
    );
    assert_eq!(err_code(b(doc! {"$arrayElemAt": [1, 0]})), 28689);
    assert_eq!(err_code(b(doc! {"$arrayElemAt": [[1], 0.5]})), 28691);
    assert_eq!(ok(b(doc! {"$first": "$a"}), &root), Some(Bson::Int32(1)));
    assert_eq!(ok(b(doc! {"$last": "$a"}), &root), Some(Bson::Int32(4)));
    assert_eq!(
        ok(b(doc! {"$slice": ["$a", -2]}), &root),
        Some(Bson::Array(vec![3.into(), 4.into()]))
    );
    assert_eq!(
        ok(b(doc! {"$slice": ["$a", 1, 2]}), &root),
        Some(Bson::Array(vec![2.into(), 3.into()]))
    );
    assert_eq!(val(b(doc! {"$isArray": [[1]]})), Bson::Boolean(true));
    assert_eq!(
        val(b(doc! {"$reverseArray": [[1, 2]]})),
        Bson::Array(vec![2.into(), 1.into()])
    );
    assert_eq!(
        val(b(doc! {"$range": [0, 6, 2]})),
        Bson::Array(vec![0.into(), 2.into(), 4.into()])
    );
    assert_eq!(
        ok(b(doc! {"$indexOfArray": ["$a", 3]}), &root),
        Some(Bson::Int32(2))
    );
    assert_eq!(
        val(b(doc! {"$allElementsTrue": [[1, true]]})),
        Bson::Boolean(true)
    );
    assert_eq!(
        val(b(doc! {"$anyElementTrue": [[0, false]]})),
        Bson::Boolean(false)
    );
}

#[test]
fn objects_and_strings() {
    assert_eq!(
        val(b(
            doc! {"$mergeObjects": [{"a": 1}, Bson::Null, {"b": 2, "a": 3}]}
        )),
        b(doc! {"a": 3, "b": 2})
    );
    assert_eq!(err_code(b(doc! {"$mergeObjects": [{"a": 1}, 5]})), 40400);
    let root = doc! {"a": {"b": 1}, "c": 5};
    assert_eq!(ok(b(doc! {"$getField": "c"}), &root), Some(Bson::Int32(5)));
    assert_eq!(
        ok(b(doc! {"$getField": {"field": "b", "input": "$a"}}), &root),
        Some(Bson::Int32(1))
    );
    assert_eq!(
        ok(
            b(doc! {"$setField": {"field": "x.y", "input": "$a", "value": 2}}),
            &root
        ),
        Some(b(doc! {"b": 1, "x.y": 2}))
    );
    assert_eq!(
        ok(
            b(doc! {"$setField": {"field": "b", "input": "$a", "value": "$$REMOVE"}}),
            &root
        ),
        Some(b(doc! {}))
    );
    assert_eq!(
        ok(
            b(doc! {"$unsetField": {"field": "b", "input": "$a"}}),
            &root
        ),
        Some(b(doc! {}))
    );
    assert_eq!(
        val(b(doc! {"$objectToArray": {"a": 1}})),
        Bson::Array(vec![b(doc! {"k": "a", "v": 1})])
    );
    assert_eq!(
        val(b(doc! {"$arrayToObject": [[["a", 1]]]})),
        b(doc! {"a": 1})
    );
    assert_eq!(
        val(b(doc! {"$concat": ["a", "b"]})),
        Bson::String("ab".into())
    );
    assert_eq!(val(b(doc! {"$concat": ["a", Bson::Null]})), Bson::Null);
    assert_eq!(err_code(b(doc! {"$concat": ["a", 1]})), 16702);
    assert_eq!(val(b(doc! {"$toUpper": "ab"})), Bson::String("AB".into()));
    assert_eq!(val(b(doc! {"$strLenCP": "héllo"})), Bson::Int32(5));
}

#[test]
fn dates() {
    let start = DateTime::from_millis(0);
    let root = doc! {"d": start};
    assert_eq!(
        ok(
            b(doc! {"$dateAdd": {"startDate": "$d", "unit": "second", "amount": 30}}),
            &root
        ),
        Some(Bson::DateTime(DateTime::from_millis(30_000)))
    );
    assert_eq!(
        ok(
            b(doc! {"$dateAdd": {"startDate": "$d", "unit": "month", "amount": 1}}),
            &root
        ),
        Some(Bson::DateTime(DateTime::from_millis(31 * 86_400_000)))
    );
    assert_eq!(
        ok(
            b(doc! {"$dateSubtract": {"startDate": "$d", "unit": "millisecond", "amount": 5i64}}),
            &root
        ),
        Some(Bson::DateTime(DateTime::from_millis(-5)))
    );
    assert_eq!(
        ok(
            b(doc! {"$dateAdd": {"startDate": "$missing", "unit": "day", "amount": 1}}),
            &root
        ),
        Some(Bson::Null)
    );
    assert!(ev(
        b(doc! {"$dateAdd": {"startDate": "$d", "unit": "day", "amount": 1.5}}),
        &root
    )
    .is_err());
    assert!(ev(
        b(doc! {"$dateAdd": {"startDate": 5, "unit": "day", "amount": 1}}),
        &root
    )
    .is_err());
    assert!(ev(
        b(doc! {"$dateAdd": {"startDate": "$d", "unit": "eon", "amount": 1}}),
        &root
    )
    .is_err());
    assert!(ev(
        b(doc! {"$dateAdd": {"startDate": "$d", "unit": "day"}}),
        &root
    )
    .is_err());
    assert!(ev(b(doc! {"$dateAdd": {"startDate": "$d", "unit": "day", "amount": 1, "timezone": "Mars/Base"}}), &root).is_err());
    assert_eq!(
        ok(
            b(
                doc! {"$dateDiff": {"startDate": "$d", "endDate": DateTime::from_millis(86_400_000 * 3 + 5), "unit": "day"}}
            ),
            &root
        ),
        Some(Bson::Int64(3))
    );
    assert_eq!(
        ok(
            b(doc! {"$dateToString": {"date": "$d", "format": "%Y-%m-%d %H:%M:%S.%L"}}),
            &root
        ),
        Some(Bson::String("1970-01-01 00:00:00.000".into()))
    );
    assert_eq!(ok(b(doc! {"$year": "$d"}), &root), Some(Bson::Int32(1970)));
    assert_eq!(
        ok(b(doc! {"$dayOfWeek": "$d"}), &root),
        Some(Bson::Int32(5))
    );
}

#[test]
fn validation() {
    assert!(validate(&b(doc! {"$add": [1, {"$bogus": 1}]})).is_err());
    assert!(validate(&b(doc! {"$literal": {"$bogus": 1}})).is_ok());
    assert!(validate(&b(doc! {"a": {"$add": [1]}})).is_ok());
    assert!(validate(&Bson::String("$".into())).is_err());
    for op in OPERATORS {
        // Every listed operator is dispatched (never "unknown").
        let r = ev(b(doc! {*op: Bson::Null}), &doc! {});
        if let Err(e) = r {
            assert_ne!(e.code, 168, "{op}");
        }
    }
}

#[test]
fn field_paths_through_arrays() {
    let root = doc! {"a": [1, {"b": 2}, [{"b": 4}, 5], {"c": 1}], "s": [1, 2]};
    assert_eq!(
        ok(Bson::String("$a.b".into()), &root),
        Some(bson::bson!([2, [4]]))
    );
    assert_eq!(
        ok(Bson::String("$s.x".into()), &root),
        Some(bson::bson!([]))
    );
}

#[test]
fn field_paths_and_field_names_with_nul_or_empty_parts_are_refused() {
    for (path, code) in [
        ("$a..b", 15998),
        ("$a.", 15998),
        ("$a\0b", 16411),
        ("$a.\0", 16411),
        ("$a.$b", 16410),
    ] {
        let e = doc! {"$add": [path, 1]};
        match validate(&b(e)) {
            Ok(()) => panic!("{path:?} was accepted"),
            Err(err) => assert_eq!(err.code, code, "{path:?}"),
        }
    }
    // Variables and ordinary paths still pass.
    for ok_path in ["$$NOW", "$$ROOT.a", "$a.b", "$a"] {
        assert!(
            validate(&b(doc! {"$add": [ok_path, 1]})).is_ok(),
            "{ok_path:?}"
        );
    }
    for field in ["\0a", "a\0", "\0"] {
        for e in [
            doc! {"$setField": {"field": field, "input": {}, "value": true}},
            doc! {"$unsetField": {"field": field, "input": {}}},
            doc! {"$getField": {"field": {"$literal": field}, "input": {}}},
        ] {
            assert_eq!(err_code(b(e.clone())), 9534700, "{e:?}");
        }
    }
}

#[test]
fn sqrt_and_pow_of_decimals_are_computed_in_decimal() {
    let dec = |s: &str| Bson::Decimal128(s.parse().unwrap());
    // 34 significant digits, where a binary double would give 17.
    assert_eq!(
        val(b(doc! {"$sqrt": dec("2")})),
        dec("1.414213562373095048801688724209698")
    );
    assert_eq!(val(b(doc! {"$sqrt": dec("0.25")})), dec("0.5"));
    assert_eq!(val(b(doc! {"$pow": [dec("1.1"), 2]})), dec("1.21"));
    assert_eq!(
        val(b(doc! {"$pow": [2, dec("0.5")]})),
        dec("1.414213562373095048801688724209698")
    );
    assert_eq!(err_code(b(doc! {"$sqrt": dec("-1")})), 28714);
}
