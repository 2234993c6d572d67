//! How one field of a frame travels: a codec type implements [`Field<T>`] for the value
//! type `T` it carries. The [`frames!`](crate::frames) table names a codec for each field.

use std::marker::PhantomData;

use crate::bytes::{ReadError, Reader, TooLong, Writer};

/// Frame-wide state a field may use besides its own bytes: the header's flag byte and the
/// payload that follows the body.
#[derive(Debug, Default, Clone, Copy)]
pub struct Cx<'a> {
    /// The header's flags: encoders set the bits they own, decoders read them.
    pub flags: u8,
    /// Decoding: the payload bytes a field claimed (empty if none did).
    pub payload: &'a [u8],
    /// Encoding: the length of the payload the caller sends after the body.
    pub payload_len: usize,
}

/// The codec of one field of type `T`.
pub trait Field<T> {
    /// Fewest bytes the field takes (payload included).
    const MIN: usize;
    /// Most bytes the field takes (payload included).
    const MAX: usize;
    /// Header flag bits the field owns; a decoder rejects the bits no field owns.
    const FLAGS: u8 = 0;
    /// True if the field claims a payload (bytes that run past the body), so the frame is
    /// not bounded like a control frame.
    const PAYLOAD: bool = false;

    /// Writes `v`; a value over its limit is [`TooLong`]`(what)`, `what` being the field's
    /// name unless the codec knows better.
    fn put(v: &T, w: &mut Writer<'_>, cx: &mut Cx<'_>, what: &'static str) -> Result<(), TooLong>;

    /// Reads a value.
    fn get<'a>(r: &mut Reader<'a>, cx: &mut Cx<'a>) -> Result<T, ReadError>;
}

/// Little-endian integers (`u8`, `u16`, `u32`, `u64`, `i64`).
#[derive(Debug)]
pub struct Le;

macro_rules! le {
    ($($t:ident),*) => {$(
        impl Field<$t> for Le {
            const MIN: usize = std::mem::size_of::<$t>();
            const MAX: usize = std::mem::size_of::<$t>();
            fn put(v: &$t, w: &mut Writer<'_>, _: &mut Cx<'_>, _: &'static str) -> Result<(), TooLong> {
                w.$t(*v);
                Ok(())
            }
            #[inline]
    fn get<'a>(r: &mut Reader<'a>, _: &mut Cx<'a>) -> Result<$t, ReadError> {
                r.$t()
            }
        }
    )*};
}
le!(u8, u16, u32, u64, i64);

/// A value of a closed set carried as a `u16` code (error codes, error classes). Decoding
/// never fails: a code the type does not know maps to its own catch-all, so a newer peer's
/// code does not break the frame.
pub trait Code16: Copy {
    /// The value's code.
    fn to_u16(self) -> u16;
    /// The value a code stands for.
    fn from_u16(code: u16) -> Self;
}

/// A [`Code16`] value, as its little-endian `u16`.
#[derive(Debug)]
pub struct Code;

impl<T: Code16> Field<T> for Code {
    const MIN: usize = 2;
    const MAX: usize = 2;
    fn put(v: &T, w: &mut Writer<'_>, _: &mut Cx<'_>, _: &'static str) -> Result<(), TooLong> {
        w.u16(v.to_u16());
        Ok(())
    }
    fn get<'a>(r: &mut Reader<'a>, _: &mut Cx<'a>) -> Result<T, ReadError> {
        r.u16().map(T::from_u16)
    }
}

/// A fixed array of bytes, as is (hashes).
#[derive(Debug)]
pub struct Raw;

impl<const N: usize> Field<[u8; N]> for Raw {
    const MIN: usize = N;
    const MAX: usize = N;
    fn put(
        v: &[u8; N],
        w: &mut Writer<'_>,
        _: &mut Cx<'_>,
        _: &'static str,
    ) -> Result<(), TooLong> {
        w.bytes(v);
        Ok(())
    }
    #[inline]
    fn get<'a>(r: &mut Reader<'a>, _: &mut Cx<'a>) -> Result<[u8; N], ReadError> {
        r.array()
    }
}

/// A string: `len u16` and at most `MAX` bytes of UTF-8.
#[derive(Debug)]
pub struct Str<const MAX: usize>;

impl<const MAX: usize> Field<String> for Str<MAX> {
    const MIN: usize = 2;
    const MAX: usize = 2 + MAX;
    fn put(
        v: &String,
        w: &mut Writer<'_>,
        _: &mut Cx<'_>,
        what: &'static str,
    ) -> Result<(), TooLong> {
        w.str_u16(v, MAX, what)
    }
    #[inline]
    fn get<'a>(r: &mut Reader<'a>, _: &mut Cx<'a>) -> Result<String, ReadError> {
        r.str_u16(MAX).map(str::to_owned)
    }
}

/// A `bool` carried by header flag bit `BIT` alone (no body bytes).
#[derive(Debug)]
pub struct Flag<const BIT: u8>;

impl<const BIT: u8> Field<bool> for Flag<BIT> {
    const MIN: usize = 0;
    const MAX: usize = 0;
    const FLAGS: u8 = BIT;
    fn put(v: &bool, _: &mut Writer<'_>, cx: &mut Cx<'_>, _: &'static str) -> Result<(), TooLong> {
        if *v {
            cx.flags |= BIT;
        }
        Ok(())
    }
    #[inline]
    fn get<'a>(_: &mut Reader<'a>, cx: &mut Cx<'a>) -> Result<bool, ReadError> {
        Ok(cx.flags & BIT != 0)
    }
}

/// The header flag bits in `MASK`, as a `u8` field (no body bytes). Bits outside `MASK`
/// are not encoded.
#[derive(Debug)]
pub struct Flags<const MASK: u8>;

impl<const MASK: u8> Field<u8> for Flags<MASK> {
    const MIN: usize = 0;
    const MAX: usize = 0;
    const FLAGS: u8 = MASK;
    fn put(v: &u8, _: &mut Writer<'_>, cx: &mut Cx<'_>, _: &'static str) -> Result<(), TooLong> {
        cx.flags |= v & MASK;
        Ok(())
    }
    #[inline]
    fn get<'a>(_: &mut Reader<'a>, cx: &mut Cx<'a>) -> Result<u8, ReadError> {
        Ok(cx.flags & MASK)
    }
}

/// An `Option` present (encoded by `C`) exactly when header flag bit `BIT` is set.
#[derive(Debug)]
pub struct IfFlag<const BIT: u8, C>(PhantomData<C>);

impl<T, C: Field<T>, const BIT: u8> Field<Option<T>> for IfFlag<BIT, C> {
    const MIN: usize = 0;
    const MAX: usize = C::MAX;
    const FLAGS: u8 = BIT | C::FLAGS;
    fn put(
        v: &Option<T>,
        w: &mut Writer<'_>,
        cx: &mut Cx<'_>,
        what: &'static str,
    ) -> Result<(), TooLong> {
        match v {
            Some(v) => {
                cx.flags |= BIT;
                C::put(v, w, cx, what)
            }
            None => Ok(()),
        }
    }
    #[inline]
    fn get<'a>(r: &mut Reader<'a>, cx: &mut Cx<'a>) -> Result<Option<T>, ReadError> {
        if cx.flags & BIT == 0 {
            return Ok(None);
        }
        C::get(r, cx).map(Some)
    }
}

/// A list: `count u16` and at most `MAX` elements, each encoded by `C`.
#[derive(Debug)]
pub struct List<C, const MAX: usize>(PhantomData<C>);

impl<T, C: Field<T>, const MAX: usize> Field<Vec<T>> for List<C, MAX> {
    const MIN: usize = 2;
    const MAX: usize = C::MAX.saturating_mul(MAX).saturating_add(2);
    const FLAGS: u8 = C::FLAGS;
    fn put(
        v: &Vec<T>,
        w: &mut Writer<'_>,
        cx: &mut Cx<'_>,
        what: &'static str,
    ) -> Result<(), TooLong> {
        let n = u16::try_from(v.len())
            .ok()
            .filter(|_| v.len() <= MAX)
            .ok_or(TooLong(what))?;
        w.u16(n);
        v.iter().try_for_each(|e| C::put(e, w, cx, what))
    }
    #[inline]
    fn get<'a>(r: &mut Reader<'a>, cx: &mut Cx<'a>) -> Result<Vec<T>, ReadError> {
        let n = usize::from(r.u16()?);
        if n > MAX {
            return Err(ReadError::TooLong { len: n, max: MAX });
        }
        // Never reserve more than the bytes left could hold: the count is the peer's word.
        let mut v = Vec::with_capacity(n.min(r.remaining() / C::MIN.max(1)));
        for _ in 0..n {
            v.push(C::get(r, cx)?);
        }
        Ok(v)
    }
}

/// A pair, its halves encoded by `A` then `B` (list elements).
impl<X, Y, A: Field<X>, B: Field<Y>> Field<(X, Y)> for (A, B) {
    const MIN: usize = A::MIN + B::MIN;
    const MAX: usize = A::MAX.saturating_add(B::MAX);
    const FLAGS: u8 = A::FLAGS | B::FLAGS;
    fn put(
        v: &(X, Y),
        w: &mut Writer<'_>,
        cx: &mut Cx<'_>,
        what: &'static str,
    ) -> Result<(), TooLong> {
        A::put(&v.0, w, cx, what)?;
        B::put(&v.1, w, cx, what)
    }
    #[inline]
    fn get<'a>(r: &mut Reader<'a>, cx: &mut Cx<'a>) -> Result<(X, Y), ReadError> {
        Ok((A::get(r, cx)?, B::get(r, cx)?))
    }
}

/// The length of a payload that runs from the end of the body to the end of the frame, at
/// most `MAX` bytes: not encoded (the frame length gives it). Decoding claims the rest of
/// the frame as [`Cx::payload`]; encoding records the length in [`Cx::payload_len`].
#[derive(Debug)]
pub struct Payload<const MAX: usize>;

impl<const MAX: usize> Field<u32> for Payload<MAX> {
    const MIN: usize = 0;
    const MAX: usize = MAX;
    const PAYLOAD: bool = true;
    fn put(
        v: &u32,
        _: &mut Writer<'_>,
        cx: &mut Cx<'_>,
        what: &'static str,
    ) -> Result<(), TooLong> {
        let n = usize::try_from(*v)
            .ok()
            .filter(|n| *n <= MAX)
            .ok_or(TooLong(what))?;
        cx.payload_len = n;
        Ok(())
    }
    #[inline]
    fn get<'a>(r: &mut Reader<'a>, cx: &mut Cx<'a>) -> Result<u32, ReadError> {
        let rest = r.peek_rest();
        let len = rest.len();
        if len > MAX {
            return Err(ReadError::TooLong { len, max: MAX });
        }
        let n = u32::try_from(len).map_err(|_| ReadError::TooLong { len, max: MAX })?;
        cx.payload = r.rest();
        Ok(n)
    }
}
