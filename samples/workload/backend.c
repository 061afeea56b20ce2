// libggml-cuda.so's stand-in (the sample's GGML_BACKEND_DL layout): a backend library that needs
// the CUDA runtime and driver, so they are mapped when it is dlopen'ed. ggml's backends export
// ggml_backend_score (the variant with the best score is chosen).

__attribute__((visibility("default"))) int ggml_backend_score(void) { return 1; }
