//! The `$group` and `$unwind` stages.

use super::*;

enum Acc {
    Sum(Num),
    Avg(Num, u64, bool),
    Extreme(Option<Bson>, bool),
    First(Option<Option<Bson>>),
    Last(Option<Bson>),
    Push(Vec<Bson>),
    AddToSet(Vec<Bson>),
    Count(i64),
    Merge(Document),
}

fn new_acc(op: &str) -> Acc {
    match op {
        "$sum" => Acc::Sum(Num::I32(0)),
        "$avg" => Acc::Avg(Num::I32(0), 0, false),
        "$min" => Acc::Extreme(None, false),
        "$max" => Acc::Extreme(None, true),
        "$first" => Acc::First(None),
        "$last" => Acc::Last(None),
        "$push" => Acc::Push(Vec::new()),
        "$addToSet" => Acc::AddToSet(Vec::new()),
        "$mergeObjects" => Acc::Merge(Document::new()),
        _ => Acc::Count(0),
    }
}

fn accumulate(acc: &mut Acc, v: Option<Bson>) -> CommandResult<()> {
    match acc {
        Acc::Sum(s) => {
            if let Some(n) = v.as_ref().and_then(Num::from_bson) {
                *s = num::add(*s, n);
            }
        }
        Acc::Avg(total, count, dec) => {
            if let Some(n) = v.as_ref().and_then(Num::from_bson) {
                *total = num::add(*total, n);
                *count += 1;
                *dec |= matches!(n, Num::Dec(_));
            }
        }
        Acc::Extreme(best, max) => {
            if let Some(v) = v.filter(|x| !matches!(x, Bson::Null | Bson::Undefined)) {
                let replace = match best {
                    None => true,
                    Some(b) => {
                        let o = compare(&v, b);
                        if *max {
                            o == Ordering::Greater
                        } else {
                            o == Ordering::Less
                        }
                    }
                };
                if replace {
                    *best = Some(v);
                }
            }
        }
        Acc::First(first) => {
            if first.is_none() {
                *first = Some(v);
            }
        }
        Acc::Last(last) => *last = Some(v.unwrap_or(Bson::Null)),
        Acc::Push(items) => {
            if let Some(v) = v {
                items.push(v);
            }
        }
        Acc::AddToSet(items) => {
            if let Some(v) = v {
                if !items.iter().any(|x| values_equal(x, &v)) {
                    items.push(v);
                }
            }
        }
        Acc::Count(n) => *n += 1,
        Acc::Merge(out) => match v {
            None | Some(Bson::Null) => {}
            Some(Bson::Document(d)) => out.extend(d),
            Some(other) => {
                return Err(loc(
                    40400,
                    format!(
                        "$mergeObjects requires object inputs, but input {other} is of type {}",
                        type_name(&other)
                    ),
                ))
            }
        },
    }
    Ok(())
}

fn finish(acc: Acc) -> Bson {
    match acc {
        Acc::Sum(s) => s.to_bson(),
        Acc::Avg(_, 0, _) => Bson::Null,
        Acc::Avg(t, c, dec) => {
            if dec {
                let n = crate::engine::decimal::from_i64(c as i64);
                Num::Dec(crate::engine::decimal::div(t.as_dec(), n)).to_bson()
            } else {
                Bson::Double(t.as_f64() / c as f64)
            }
        }
        Acc::Extreme(b, _) => b.unwrap_or(Bson::Null),
        Acc::First(f) => f.flatten().unwrap_or(Bson::Null),
        Acc::Last(l) => l.unwrap_or(Bson::Null),
        Acc::Push(v) | Acc::AddToSet(v) => Bson::Array(v),
        Acc::Count(n) => i32::try_from(n).map(Bson::Int32).unwrap_or(Bson::Int64(n)),
        Acc::Merge(d) => Bson::Document(d),
    }
}

pub(super) fn group(g: &Group, docs: Vec<Document>, vars: &Vars) -> CommandResult<Vec<Document>> {
    let mut index: BTreeMap<OrdBson, usize> = BTreeMap::new();
    let mut groups: Vec<(Bson, Vec<Acc>)> = Vec::new();
    for d in &docs {
        let key = expr::evaluate(&g.id, d, vars)?.unwrap_or(Bson::Null);
        let i = match index.get(&OrdBson(key.clone())) {
            Some(i) => *i,
            None => {
                groups.push((
                    key.clone(),
                    g.fields.iter().map(|(_, op, _)| new_acc(op)).collect(),
                ));
                index.insert(OrdBson(key), groups.len() - 1);
                groups.len() - 1
            }
        };
        for (j, (_, op, e)) in g.fields.iter().enumerate() {
            let v = if op == "$count" {
                None
            } else {
                expr::evaluate(e, d, vars)?
            };
            accumulate(&mut groups[i].1[j], v)?;
        }
    }
    Ok(groups
        .into_iter()
        .map(|(key, accs)| {
            let mut out = Document::new();
            out.insert("_id", key);
            for ((name, _, _), acc) in g.fields.iter().zip(accs) {
                out.insert(name.clone(), finish(acc));
            }
            out
        })
        .collect())
}

pub(super) fn unwind(u: &Unwind, docs: Vec<Document>) -> Vec<Document> {
    let parts: Vec<&str> = u.path.split('.').collect();
    // `includeArrayIndex: "a.idx"` writes the nested field `idx` of `a`.
    let index_parts: Option<Vec<&str>> = u.index_field.as_ref().map(|f| f.split('.').collect());
    let mut out = Vec::new();
    for d in docs {
        let value = get_doc_path(&d, &parts);
        match value {
            Some(Bson::Array(a)) if !a.is_empty() => {
                for (i, el) in a.iter().enumerate() {
                    let mut nd = d.clone();
                    set_agg_path(&mut nd, &parts, el.clone());
                    if let Some(f) = &index_parts {
                        set_agg_path(&mut nd, f, Bson::Int64(i as i64));
                    }
                    out.push(nd);
                }
            }
            Some(Bson::Array(_)) | None | Some(Bson::Null) => {
                if u.preserve {
                    let mut nd = d.clone();
                    if matches!(value, Some(Bson::Array(_))) {
                        crate::engine::path::remove_agg_path(&mut nd, &parts);
                    }
                    if let Some(f) = &index_parts {
                        set_agg_path(&mut nd, f, Bson::Null);
                    }
                    out.push(nd);
                }
            }
            Some(_) => {
                let mut nd = d.clone();
                if let Some(f) = &index_parts {
                    set_agg_path(&mut nd, f, Bson::Null);
                }
                out.push(nd);
            }
        }
    }
    out
}

fn get_doc_path(d: &Document, parts: &[&str]) -> Option<Bson> {
    let mut cur = d.get(parts[0])?;
    for p in &parts[1..] {
        cur = cur.as_document()?.get(*p)?;
    }
    Some(cur.clone())
}
