//! Applying parsed update operators to a document.

use super::*;

/// A place in a document: a field of a document, or an element of an array.
pub(super) enum Slot<'a> {
    Field(&'a mut Document, &'a str),
    Elem(&'a mut Vec<Bson>, usize),
}

impl Slot<'_> {
    fn get(&self) -> Option<&Bson> {
        match self {
            Slot::Field(d, k) => d.get(*k),
            Slot::Elem(a, i) => a.get(*i),
        }
    }
    fn get_mut(&mut self) -> Option<&mut Bson> {
        match self {
            Slot::Field(d, k) => d.get_mut(*k),
            Slot::Elem(a, i) => a.get_mut(*i),
        }
    }
    pub(super) fn set(&mut self, v: Bson) {
        match self {
            Slot::Field(d, k) => {
                d.insert(k.to_string(), v);
            }
            Slot::Elem(a, i) => {
                while a.len() <= *i {
                    a.push(Bson::Null);
                }
                a[*i] = v;
            }
        }
    }
    fn remove(&mut self) -> Option<Bson> {
        match self {
            Slot::Field(d, k) => d.remove(*k),
            Slot::Elem(a, i) => a.get_mut(*i).map(|x| std::mem::replace(x, Bson::Null)),
        }
    }
}

enum Container<'a> {
    Doc(&'a mut Document),
    Arr(&'a mut Vec<Bson>),
}

const MAX_PAD: usize = 1_500_000;

/// `value`, not a container, stands at `parts` element `p`: with `create` the path is not viable
/// (the next part cannot be created in it), without it the path does not exist.
fn blocked<T>(parts: &[String], p: &str, value: &Bson, create: bool) -> CommandResult<Option<T>> {
    if create {
        let next = parts
            .iter()
            .skip_while(|x| x.as_str() != p)
            .nth(1)
            .map(String::as_str)
            .unwrap_or("");
        return Err(path_not_viable(next, p, value));
    }
    Ok(None)
}

/// Finds the slot of `parts`; with `create`, missing intermediate documents are created (and
/// arrays padded with nulls), and a non-container in the way is an error (PathNotViable);
/// without it, `None` when the path cannot exist.
pub(super) fn slot<'a>(
    doc: &'a mut Document,
    parts: &'a [String],
    create: bool,
) -> CommandResult<Option<Slot<'a>>> {
    let Some((last, inter)) = parts.split_last() else {
        return Ok(None);
    };
    let mut cur = Container::Doc(doc);
    let mut parent_name: &str = "";
    for p in inter {
        cur = match cur {
            Container::Doc(d) => {
                if !d.contains_key(p) {
                    if !create {
                        return Ok(None);
                    }
                    d.insert(p.clone(), Document::new());
                }
                match d.get_mut(p) {
                    Some(Bson::Document(sub)) => Container::Doc(sub),
                    Some(Bson::Array(a)) => Container::Arr(a),
                    Some(other) => return blocked(parts, p, other, create),
                    None => return Ok(None),
                }
            }
            Container::Arr(a) => {
                let Some(idx) = array_index(p) else {
                    if create {
                        return Err(path_not_viable(p, parent_name, &Bson::Array(a.clone())));
                    }
                    return Ok(None);
                };
                if idx >= a.len() {
                    if !create {
                        return Ok(None);
                    }
                    if idx > MAX_PAD {
                        return Err(CommandError::failed_to_parse(
                            "can't backfill array to larger than 1500000 elements",
                        ));
                    }
                    while a.len() < idx {
                        a.push(Bson::Null);
                    }
                    a.push(Bson::Document(Document::new()));
                }
                match &mut a[idx] {
                    Bson::Document(sub) => Container::Doc(sub),
                    Bson::Array(inner) => Container::Arr(inner),
                    other => return blocked(parts, p, other, create),
                }
            }
        };
        parent_name = p;
    }
    match cur {
        Container::Doc(d) => Ok(Some(Slot::Field(d, last))),
        Container::Arr(a) => match array_index(last) {
            Some(i) => {
                if i >= a.len() && !create {
                    return Ok(None);
                }
                if i > MAX_PAD {
                    return Err(CommandError::failed_to_parse(
                        "can't backfill array to larger than 1500000 elements",
                    ));
                }
                Ok(Some(Slot::Elem(a, i)))
            }
            None => {
                if create {
                    Err(path_not_viable(last, parent_name, &Bson::Array(a.clone())))
                } else {
                    Ok(None)
                }
            }
        },
    }
}

fn zero_like(n: Num) -> Bson {
    match n {
        Num::I32(_) => Bson::Int32(0),
        Num::I64(_) => Bson::Int64(0),
        Num::F64(_) => Bson::Double(0.0),
        Num::Dec(_) => Num::Dec(crate::engine::decimal::from_i64(0)).to_bson(),
    }
}

pub(super) fn apply_op(
    doc: &mut Document,
    op: &Op,
    is_insert: bool,
    vars: &Vars,
) -> CommandResult<()> {
    let id = id_desc(doc);
    let path = op.path.as_str();
    if !is_insert {
        if let Some(top) = op.parts.first().filter(|p| p.starts_with('$')) {
            return Err(code(
                52,
                "DollarPrefixedFieldName",
                format!(
                    "The dollar ($) prefixed field '{top}' in '{path}' is not valid for storage."
                ),
            ));
        }
    }
    match &op.kind {
        Kind::Set(v) => {
            if let Some(mut s) = slot(doc, &op.parts, true)? {
                s.set(v.clone());
            }
        }
        Kind::SetOnInsert(v) => {
            if is_insert {
                if let Some(mut s) = slot(doc, &op.parts, true)? {
                    s.set(v.clone());
                }
            }
        }
        Kind::Unset => {
            if let Some(mut s) = slot(doc, &op.parts, false)? {
                s.remove();
            }
        }
        Kind::Inc(n, raw) | Kind::Mul(n, raw) => {
            let inc = matches!(op.kind, Kind::Inc(..));
            let name = if inc { "$inc" } else { "$mul" };
            if let Some(mut s) = slot(doc, &op.parts, true)? {
                let new = match s.get() {
                    None => {
                        if inc {
                            raw.clone()
                        } else {
                            zero_like(*n)
                        }
                    }
                    Some(cur) => {
                        let c = Num::from_bson(cur).ok_or_else(|| {
                            CommandError::type_mismatch(format!(
                                "Cannot apply {name} to a value of non-numeric type. {id} has the field '{}' of non-numeric type {}",
                                op.parts.last().map(String::as_str).unwrap_or(path),
                                type_name(cur)
                            ))
                        })?;
                        let r = if inc {
                            num::checked_add(c, *n)
                        } else {
                            num::checked_mul(c, *n)
                        };
                        r.ok_or_else(|| {
                            CommandError::bad_value(format!(
                                "Failed to apply {name} operations to current value ({cur}) for document {id}"
                            ))
                        })?
                        .to_bson()
                    }
                };
                s.set(new);
            }
        }
        Kind::Min(v) | Kind::Max(v) => {
            let want = if matches!(op.kind, Kind::Min(_)) {
                Ordering::Less
            } else {
                Ordering::Greater
            };
            if let Some(mut s) = slot(doc, &op.parts, true)? {
                let replace = match s.get() {
                    None => true,
                    Some(cur) => compare(v, cur) == want,
                };
                if replace {
                    s.set(v.clone());
                }
            }
        }
        Kind::CurrentDate(ts) => {
            let v = if *ts {
                let ms = vars.now.timestamp_millis();
                Bson::Timestamp(Timestamp {
                    time: u32::try_from(ms.div_euclid(1000)).unwrap_or(0),
                    increment: 1,
                })
            } else {
                Bson::DateTime(vars.now)
            };
            if let Some(mut s) = slot(doc, &op.parts, true)? {
                s.set(v);
            }
        }
        Kind::Rename(to_parts, to) => {
            // Neither end may be inside an array.
            check_rename_not_in_array(doc, &op.parts, path, "source")?;
            let value = match slot(doc, &op.parts, false)? {
                Some(mut s) => match s.get() {
                    Some(_) => s.remove(),
                    None => None,
                },
                None => None,
            };
            if let Some(v) = value {
                check_rename_not_in_array(doc, to_parts, to, "destination")?;
                if let Some(mut s) = slot(doc, to_parts, true)? {
                    s.set(v);
                }
            }
        }
        Kind::Push(spec) => {
            if let Some(mut s) = slot(doc, &op.parts, true)? {
                let mut arr = match s.get() {
                    None => Vec::new(),
                    Some(Bson::Array(a)) => a.clone(),
                    Some(other) => {
                        return Err(CommandError::bad_value(format!(
                            "The field '{}' must be an array but is of type {} in document {id}",
                            op.parts.last().map(String::as_str).unwrap_or(path),
                            type_name(other)
                        )))
                    }
                };
                let len = arr.len() as i64;
                let at = match spec.position {
                    None => len,
                    Some(p) if p >= 0 => p.min(len),
                    Some(p) => len.saturating_add(p).max(0),
                } as usize;
                arr.splice(at..at, spec.each.iter().cloned());
                if let Some(sort) = &spec.sort {
                    match sort {
                        ElemSort::Whole(asc) => arr.sort_by(|a, b| {
                            let o = compare(a, b);
                            if *asc {
                                o
                            } else {
                                o.reverse()
                            }
                        }),
                        ElemSort::Fields(spec) => {
                            let keys = pipeline::parse_sort_spec(spec)?;
                            arr.sort_by(|a, b| pipeline::compare_values_by_spec(a, b, &keys));
                        }
                    }
                }
                if let Some(n) = spec.slice {
                    let len = arr.len() as i64;
                    if n >= 0 {
                        arr.truncate(n.min(len) as usize);
                    } else {
                        let keep = n.saturating_neg().min(len) as usize;
                        let start = arr.len() - keep;
                        arr.drain(..start);
                    }
                }
                s.set(Bson::Array(arr));
            }
        }
        Kind::AddToSet(items) => {
            if let Some(mut s) = slot(doc, &op.parts, true)? {
                let mut arr = match s.get() {
                    None => Vec::new(),
                    Some(Bson::Array(a)) => a.clone(),
                    Some(other) => {
                        return Err(CommandError::bad_value(format!(
                            "Cannot apply $addToSet to non-array field. Field named '{}' has non-array type {}",
                            op.parts.last().map(String::as_str).unwrap_or(path),
                            type_name(other)
                        )))
                    }
                };
                let existed = s.get().is_some();
                let mut changed = false;
                for it in items {
                    if !arr.iter().any(|x| values_equal(x, it)) {
                        arr.push(it.clone());
                        changed = true;
                    }
                }
                if changed || !existed {
                    s.set(Bson::Array(arr));
                }
            }
        }
        Kind::Pop(first) => {
            if let Some(mut s) = slot(doc, &op.parts, false)? {
                match s.get_mut() {
                    None => {}
                    Some(Bson::Array(a)) if a.is_empty() => {}
                    Some(Bson::Array(a)) => {
                        if *first {
                            a.remove(0);
                        } else {
                            a.pop();
                        }
                    }
                    Some(other) => {
                        return Err(CommandError::type_mismatch(format!(
                            "Path '{path}' contains an element of non-array type '{}'",
                            type_name(other)
                        )))
                    }
                }
            }
        }
        Kind::Pull(cond) => {
            if let Some(mut s) = slot(doc, &op.parts, false)? {
                match s.get_mut() {
                    None => {}
                    Some(Bson::Array(a)) => {
                        let mut keep = Vec::with_capacity(a.len());
                        for el in a.iter() {
                            if !cond.matches_as_field(el, vars)? {
                                keep.push(el.clone());
                            }
                        }
                        *a = keep;
                    }
                    Some(_) => {
                        return Err(CommandError::bad_value(
                            "Cannot apply $pull to a non-array value",
                        ))
                    }
                }
            }
        }
        Kind::PullAll(items) => {
            if let Some(mut s) = slot(doc, &op.parts, false)? {
                match s.get_mut() {
                    None => {}
                    Some(Bson::Array(a)) => {
                        a.retain(|el| !items.iter().any(|it| values_equal(el, it)))
                    }
                    Some(_) => {
                        return Err(CommandError::bad_value(
                            "Cannot apply $pullAll to a non-array value",
                        ))
                    }
                }
            }
        }
    }
    Ok(())
}

fn check_rename_not_in_array(
    doc: &Document,
    parts: &[String],
    path: &str,
    what: &str,
) -> CommandResult<()> {
    let mut cur = doc;
    for p in &parts[..parts.len().saturating_sub(1)] {
        match cur.get(p) {
            Some(Bson::Document(d)) => cur = d,
            Some(Bson::Array(_)) => {
                return Err(CommandError::bad_value(format!(
                    "The {what} field cannot be an array element, '{path}' in doc with {p} being an array"
                )))
            }
            _ => return Ok(()),
        }
    }
    Ok(())
}
