//! A component that claims the current contract version, `wasmsched:policy@0.2.0`, but whose
//! `plugin.init` answers a plain string instead of the contract's `plugin-info` record. The host
//! must refuse it at load, naming the export and the type it expected. Natively this crate is
//! empty.

// Raw wit-bindgen output declares exported `unsafe extern` functions.
#![allow(unsafe_code)]

#[cfg(target_family = "wasm")]
mod component {
    wit_bindgen::generate!({
        inline: r#"
            package wasmsched:policy@0.2.0;
            interface plugin {
                init: func(config: string) -> result<string, string>;
            }
            world mistyped-plugin {
                export plugin;
            }
        "#,
    });

    struct Mistyped;

    impl exports::wasmsched::policy::plugin::Guest for Mistyped {
        fn init(_config: String) -> Result<String, String> {
            Ok("a string where a record belongs".into())
        }
    }

    export!(Mistyped);
}
