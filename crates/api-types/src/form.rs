//! A `multipart/form-data` body split into its parts (an upload to transcribe, an image to
//! redraw). The server parses the bytes; what an upload must hold is checked in the backends
//! crate, against these types.

use bytes::Bytes;

/// One part of a multipart form.
#[derive(Debug, Clone)]
pub struct Part {
    pub name: String,
    pub file_name: Option<String>,
    pub content_type: Option<String>,
    pub data: Bytes,
}

/// The parts of a form, in the order they came.
#[derive(Debug, Clone, Default)]
pub struct Form {
    pub parts: Vec<Part>,
}

/// A field that fails a check: what is wrong, and the field's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadField {
    pub message: String,
    pub field: String,
}

impl BadField {
    pub fn new(message: impl Into<String>, field: &str) -> BadField {
        BadField { message: message.into(), field: field.to_string() }
    }
}

impl Form {
    /// A form of `(name, file name, bytes)` fields, in order (no content types).
    pub fn of(fields: &[(&str, Option<&str>, &[u8])]) -> Form {
        let part = |(name, file_name, data): &(&str, Option<&str>, &[u8])| Part {
            name: name.to_string(),
            file_name: file_name.map(str::to_string),
            content_type: None,
            data: Bytes::copy_from_slice(data),
        };
        Form { parts: fields.iter().map(part).collect() }
    }

    pub fn get(&self, name: &str) -> Option<&Part> {
        self.parts.iter().find(|p| p.name == name)
    }

    /// A text field's value; refused when it is not UTF-8.
    pub fn text(&self, name: &str) -> Result<Option<&str>, BadField> {
        self.get(name)
            .map(|p| {
                std::str::from_utf8(&p.data)
                    .map_err(|_| BadField::new(format!("Field '{name}' is not UTF-8 text"), name))
            })
            .transpose()
    }

    /// A text field that must not be empty, or "Missing '<name>' field in request".
    pub fn required(&self, name: &str) -> Result<&str, BadField> {
        let v = self.text(name)?.filter(|v| !v.is_empty());
        v.ok_or_else(|| BadField::new(format!("Missing '{name}' field in request"), name))
    }

    /// A text field parsed as a number (None: absent or blank).
    pub fn number<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, BadField> {
        match self.text(name)?.map(str::trim).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| BadField::new(format!("Invalid value for '{name}': '{v}' is not a valid number"), name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_as_text_or_numbers_and_refusals_name_the_field() {
        let named = [("model", &b"m"[..]), ("n", b" 3 "), ("bad", b"\xff"), ("x", b"three"), ("empty", b"")];
        let f = Form::of(&named.map(|(n, d)| (n, None, d)));
        assert_eq!(f.required("model"), Ok("m"));
        assert_eq!(f.number::<u32>("n"), Ok(Some(3)));
        assert_eq!(f.number::<u32>("absent"), Ok(None));
        assert_eq!(f.text("bad").unwrap_err().field, "bad");
        let e = f.number::<u32>("x").unwrap_err();
        assert_eq!(e, BadField::new("Invalid value for 'x': 'three' is not a valid number", "x"));
        assert_eq!(f.required("empty").unwrap_err().message, "Missing 'empty' field in request");
    }
}
