//! Protobuf wire format: reading tagged fields and writing them (varints, length-delimited,
//! fixed 64/32-bit), with every length checked so that no input can panic.

use super::ProtoError;

pub enum Raw<'a> {
    Varint(u64),
    Fixed64(u64),
    Fixed32,
    Bytes(&'a [u8]),
}

pub fn varint(buf: &[u8], pos: &mut usize) -> Result<u64, ProtoError> {
    let mut out = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos).ok_or(ProtoError::Truncated)?;
        *pos += 1;
        out |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(out);
        }
    }
    Err(ProtoError::Malformed("varint too long".into()))
}

fn take<'a>(buf: &'a [u8], pos: &mut usize, len: usize) -> Result<&'a [u8], ProtoError> {
    let end = pos
        .checked_add(len)
        .filter(|e| *e <= buf.len())
        .ok_or(ProtoError::Truncated)?;
    let out = &buf[*pos..end];
    *pos = end;
    Ok(out)
}

/// Every `(field number, value)` of a message, in wire order.
pub fn fields(buf: &[u8]) -> Result<Vec<(u32, Raw<'_>)>, ProtoError> {
    let mut pos = 0;
    let mut out = vec![];
    while pos < buf.len() {
        let key = varint(buf, &mut pos)?;
        let num =
            u32::try_from(key >> 3).map_err(|_| ProtoError::Malformed("field number".into()))?;
        let raw = match key & 7 {
            0 => Raw::Varint(varint(buf, &mut pos)?),
            1 => {
                let b = take(buf, &mut pos, 8)?;
                Raw::Fixed64(u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            }
            2 => {
                let len =
                    usize::try_from(varint(buf, &mut pos)?).map_err(|_| ProtoError::Truncated)?;
                Raw::Bytes(take(buf, &mut pos, len)?)
            }
            5 => {
                take(buf, &mut pos, 4)?;
                Raw::Fixed32
            }
            w => return Err(ProtoError::Malformed(format!("unsupported wire type {w}"))),
        };
        out.push((num, raw));
    }
    Ok(out)
}

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub fn put_key(out: &mut Vec<u8>, tag: u32, wire: u8) {
    put_varint(out, (u64::from(tag) << 3) | u64::from(wire));
}

pub fn put_bytes(out: &mut Vec<u8>, tag: u32, b: &[u8]) {
    put_key(out, tag, 2);
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

pub fn put_uvarint_field(out: &mut Vec<u8>, tag: u32, v: u64) {
    put_key(out, tag, 0);
    put_varint(out, v);
}

pub fn put_double(out: &mut Vec<u8>, tag: u32, v: f64) {
    put_key(out, tag, 1);
    out.extend_from_slice(&v.to_le_bytes());
}
