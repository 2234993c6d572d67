//! The [`frames!`](crate::frames) table.

/// Generates a protocol's frame enum and its body codec from one table.
///
/// Each row is a frame: its doc comment, its variant name, its type code, and its fields in
/// wire order, each `name: Type as Codec` where `Codec` implements
/// [`Field<Type>`](crate::Field). A row is a struct variant `Name = code { fields }`, a
/// one-field tuple variant `Name = code (binding: Type as Codec)` (the binding names the
/// field in the generated code only), or a unit variant `Name = code`.
///
/// The enum gets:
/// - `code(&self)`: the frame's type code;
/// - `encode_body(&self, w, cx)`: writes the fields in order (the protocol writes its own
///   header around them, with the flags the fields set in `cx`);
/// - `decode_body(code, r, cx)`: reads a frame of type `code` (`ReadError::UnknownType` if
///   no row has it), the
///   header's flags given in `cx`; trailing bytes are left to the caller's
///   [`Reader::finish`](crate::Reader::finish);
/// - `body_bounds(code)`: the fewest and most body bytes (payload included) of that type;
/// - `flags_allowed(code)`: the header flag bits its fields own;
/// - `carries_payload(code)`: whether a field of it claims a payload;
/// - `CODES`: every type code, in table order.
///
/// ```
/// ferry_wire::frames! {
///     /// A tiny protocol.
///     #[derive(Debug, PartialEq)]
///     pub enum Msg: u8 {
///         /// Greeting.
///         Hello = 1 {
///             /// Version.
///             version: u16 as ferry_wire::Le,
///             /// Name.
///             name: String as ferry_wire::Str<16>,
///         },
///         /// A ping.
///         Ping = 2 (seq: u64 as ferry_wire::Le),
///         /// Goodbye.
///         Bye = 3,
///     }
/// }
/// let mut out = Vec::new();
/// let hello = Msg::Hello { version: 1, name: "a".into() };
/// hello.encode_body(&mut ferry_wire::Writer::new(&mut out), &mut Default::default()).unwrap();
/// assert_eq!(out, [1, 0, 1, 0, b'a']);
/// let mut r = ferry_wire::Reader::new(&out);
/// let back = Msg::decode_body(1, &mut r, &mut Default::default()).unwrap();
/// assert_eq!(back, hello);
/// assert_eq!(Msg::body_bounds(1), Some((4, 20)));
/// assert_eq!(Msg::body_bounds(3), Some((0, 0)));
/// ```
#[macro_export]
macro_rules! frames {
    (
        $(#[$meta:meta])*
        $vis:vis enum $Name:ident : $Code:ty {
            $(
                $(#[$vmeta:meta])*
                $V:ident = $code:literal
                $( { $( $(#[$fmeta:meta])* $f:ident : $T:ty as $C:ty ),* $(,)? } )?
                $( ( $tf:ident : $TT:ty as $TC:ty ) )?
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $Name {
            $(
                $(#[$vmeta])*
                $V $( { $( $(#[$fmeta])* $f : $T ),* } )? $( ( $TT ) )?,
            )*
        }

        #[allow(dead_code)]
        impl $Name {
            /// Every type code, in table order.
            pub const CODES: &'static [$Code] = &[$($code),*];

            /// The frame's type code.
            pub fn code(&self) -> $Code {
                match self {
                    $( Self::$V { .. } => $code, )*
                }
            }

            /// Writes the frame's fields in wire order; the flags they own go to `cx.flags`,
            /// a payload's length to `cx.payload_len`.
            pub fn encode_body(
                &self,
                w: &mut $crate::Writer<'_>,
                cx: &mut $crate::Cx<'_>,
            ) -> ::core::result::Result<(), $crate::TooLong> {
                match self {
                    $(
                        Self::$V $( { $($f),* } )? $( ($tf) )? => {
                            $( $( <$C as $crate::Field<$T>>::put($f, w, cx, stringify!($f))?; )* )?
                            $( <$TC as $crate::Field<$TT>>::put($tf, w, cx, stringify!($tf))?; )?
                        }
                    )*
                }
                Ok(())
            }

            /// Reads the fields of a frame of type `code` ([`ReadError::UnknownType`]: no
            /// such type), the header's flags given in `cx.flags`; a payload lands in
            /// `cx.payload`.
            // Inlined into the protocol's decoder so the frame is built where it is
            // returned, not copied out of this function (measured: ~1.5x the instructions
            // per xfer frame without it).
            #[inline(always)]
            pub fn decode_body<'a>(
                code: $Code,
                r: &mut $crate::Reader<'a>,
                cx: &mut $crate::Cx<'a>,
            ) -> ::core::result::Result<Self, $crate::ReadError> {
                Ok(match code {
                    $(
                        $code => Self::$V
                            $( { $( $f: <$C as $crate::Field<$T>>::get(r, cx)? ),* } )?
                            $( ( <$TC as $crate::Field<$TT>>::get(r, cx)? ) )?,
                    )*
                    _ => return Err($crate::ReadError::UnknownType),
                })
            }

            /// The fewest and most body bytes (payload included) of a frame of type
            /// `code`, or `None` for an unknown type.
            pub const fn body_bounds(code: $Code) -> ::core::option::Option<(usize, usize)> {
                match code {
                    $(
                        $code => Some((
                            0 $( $( + <$C as $crate::Field<$T>>::MIN )* )?
                              $( + <$TC as $crate::Field<$TT>>::MIN )?,
                            0usize
                                $( $( .saturating_add(<$C as $crate::Field<$T>>::MAX) )* )?
                                $( .saturating_add(<$TC as $crate::Field<$TT>>::MAX) )?,
                        )),
                    )*
                    _ => None,
                }
            }

            /// The header flag bits a frame of type `code` may carry (those its fields
            /// own).
            pub const fn flags_allowed(code: $Code) -> u8 {
                match code {
                    $(
                        $code => 0
                            $( $( | <$C as $crate::Field<$T>>::FLAGS )* )?
                            $( | <$TC as $crate::Field<$TT>>::FLAGS )?,
                    )*
                    _ => 0,
                }
            }

            /// True if a frame of type `code` carries a payload after its body.
            pub const fn carries_payload(code: $Code) -> bool {
                match code {
                    $(
                        $code => false
                            $( $( || <$C as $crate::Field<$T>>::PAYLOAD )* )?
                            $( || <$TC as $crate::Field<$TT>>::PAYLOAD )?,
                    )*
                    _ => false,
                }
            }
        }
    };
}
