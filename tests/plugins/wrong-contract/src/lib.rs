//! A component built against `wasmsched:policy@0.9.0`, which is incompatible with 0.1 (for 0.x
//! versions the minor is the breaking part). The host must refuse it at load with a clear error.
//! Natively this crate is empty.

// Raw wit-bindgen output declares exported `unsafe extern` functions.
#![allow(unsafe_code)]

#[cfg(target_family = "wasm")]
mod component {
    wit_bindgen::generate!({
        inline: r#"
            package wasmsched:policy@0.9.0;
            interface plugin {
                init: func(config: string) -> result<string, string>;
            }
            world future-plugin {
                export plugin;
            }
        "#,
    });

    struct Future;

    impl exports::wasmsched::policy::plugin::Guest for Future {
        fn init(_config: String) -> Result<String, String> {
            Ok("from the future".into())
        }
    }

    export!(Future);
}
