// The out-of-line std::vector<unsigned char> members, compiled into each library that has one.

#include <vector>

// Kept in its own translation unit so that callers cannot inline _M_default_append: like the
// real libllama-common.so and libllama-server-impl.so, each library exports a weak copy.
template class std::vector<unsigned char>;
