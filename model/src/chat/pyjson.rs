//! The `tojson` filter as transformers defines it for chat templates: Python's `json.dumps` with
//! `ensure_ascii=False` by default and the `indent`, `separators` and `sort_keys` options. It
//! replaces minijinja's own `tojson`, which writes compact JSON (`{"a":1}`) and escapes HTML
//! characters, where Python writes `{"a": 1}` and leaves `<`, `&` and `'` alone — tool schemas
//! printed by Llama 3.1, Qwen and Mistral templates would otherwise differ byte for byte.

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// `json.dumps`' formatting choices.
struct Style {
    ensure_ascii: bool,
    /// `None`: everything on one line; `Some(unit)`: one item a line, nested `unit`s deep.
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.into())
}

/// `value | tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`; the
/// options may also come positionally, in that order, as Python allows.
pub(super) fn tojson(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let names = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > names.len() {
        return Err(Error::new(ErrorKind::TooManyArguments, "tojson takes at most 4 options"));
    }
    let mut opts: [Value; 4] = Default::default();
    for (slot, v) in opts.iter_mut().zip(args.iter()) {
        *slot = v.clone();
    }
    for (slot, name) in opts.iter_mut().zip(names) {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            *slot = v;
        }
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = opts;
    let indent = match indent.kind() {
        ValueKind::Undefined | ValueKind::None => None,
        ValueKind::String => Some(indent.as_str().unwrap_or_default().to_owned()),
        // Python repeats a space `indent` times; a negative count is no space at all.
        ValueKind::Number => Some(" ".repeat(i64::try_from(indent).unwrap_or(0).max(0) as usize)),
        _ => return Err(invalid("tojson: indent must be an integer or a string")),
    };
    // Python drops the space after the comma once lines are indented.
    let (mut item_sep, mut key_sep) = (if indent.is_some() { "," } else { ", " }.to_owned(), ": ".to_owned());
    if !separators.is_undefined() && !separators.is_none() {
        let parts: Vec<Value> = separators.try_iter()?.collect();
        match parts.as_slice() {
            [i, k] if i.as_str().is_some() && k.as_str().is_some() => {
                item_sep = i.as_str().unwrap_or_default().to_owned();
                key_sep = k.as_str().unwrap_or_default().to_owned();
            }
            _ => return Err(invalid("tojson: separators must be a pair of strings")),
        }
    }
    let style = Style {
        ensure_ascii: ensure_ascii.is_true(),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.is_true(),
    };
    let mut out = String::new();
    write_value(&mut out, value, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

/// Newline plus `depth` indent units (nothing without `indent`).
fn newline(out: &mut String, style: &Style, depth: usize) {
    if let Some(unit) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(unit);
        }
    }
}

fn write_value(out: &mut String, v: &Value, style: &Style, depth: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number if v.is_integer() => {
            let n = i128::try_from(v.clone())?;
            out.push_str(&n.to_string());
        }
        ValueKind::Number => out.push_str(&py_float(f64::try_from(v.clone())?)),
        ValueKind::String => write_str(out, v.as_str().unwrap_or_default(), style.ensure_ascii),
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if style.sort_keys {
                keys.sort_by_key(key_string);
            }
            write_items(out, style, depth, ['{', '}'], &keys, |out, k| {
                write_str(out, &key_string(k), style.ensure_ascii);
                out.push_str(&style.key_sep);
                write_value(out, &v.get_item(k)?, style, depth + 1)
            })?;
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_items(out, style, depth, ['[', ']'], &items, |out, item| {
                write_value(out, item, style, depth + 1)
            })?;
        }
        // Python fails on these too (`Undefined`, bytes, objects are not JSON serializable).
        kind => return Err(invalid(format!("tojson: a value of kind {kind} is not JSON serializable"))),
    }
    Ok(())
}

/// A list or a dict at `depth` between `brackets`: `[]` / `{}` when empty, otherwise each item
/// written by `item` after its separator and newline, the closing bracket on a line of its own.
fn write_items(
    out: &mut String,
    style: &Style,
    depth: usize,
    [open, close]: [char; 2],
    items: &[Value],
    mut item: impl FnMut(&mut String, &Value) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, v) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        newline(out, style, depth + 1);
        item(out, v)?;
    }
    newline(out, style, depth);
    out.push(close);
    Ok(())
}

/// Python turns `None`, booleans and numbers used as keys into strings too.
fn key_string(k: &Value) -> String {
    match k.kind() {
        ValueKind::String => k.as_str().unwrap_or_default().to_owned(),
        ValueKind::None => "null".to_owned(),
        ValueKind::Bool => if k.is_true() { "true" } else { "false" }.to_owned(),
        ValueKind::Number if !k.is_integer() => f64::try_from(k.clone()).map(py_float).unwrap_or_default(),
        _ => k.to_string(),
    }
}

/// A JSON string as Python escapes it: `"`, `\`, the control characters, and with `ensure_ascii`
/// everything outside printable ASCII as `\uXXXX` (UTF-16 surrogate pairs above the BMP).
fn write_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest digits that round-trip, positional notation for decimal
/// exponents in -4..16 (always with a fractional part), otherwise `1.5e+16` / `1e-05` style.
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    // Rust's `{:e}` also prints the shortest round-trip digits: "1.5e16", "-2e-7", "0e0".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if f.is_sign_negative() { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let point = exp + 1;
        let body = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else {
            let point = point as usize;
            if digits.len() <= point {
                format!("{digits}{}.0", "0".repeat(point - digits.len()))
            } else {
                format!("{}.{}", &digits[..point], &digits[point..])
            }
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        let cases = [
            (1.0, "1.0"),
            (7.5, "7.5"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (123456789.125, "123456789.125"),
            (2.5e300, "2.5e+300"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ];
        for (f, want) in cases {
            assert_eq!(py_float(f), want, "{f:e}");
        }
    }

    #[test]
    fn strings_escape_as_python_json() {
        let mut s = String::new();
        write_str(&mut s, "a\"b\\c\nd\u{1}é🦀<&'\u{7f}", false);
        assert_eq!(s, r#""a\"b\\c\nd\u0001é🦀<&'"#.to_owned() + "\u{7f}\"");
        let mut s = String::new();
        write_str(&mut s, "é🦀\u{7f}", true);
        assert_eq!(s, r#""\u00e9\ud83e\udd80\u007f""#);
    }
}
