# common/cmake/build-info-gen-cpp.cmake for ik_llama.cpp, which ik-llama-cpp-python 0.1.5's sdist
# leaves out: common/CMakeLists.txt runs it (cmake -P, from the source root) to write
# common/build-info.cpp from its template, as upstream llama.cpp's script of that name does.
# cmake/build-info.cmake sets BUILD_NUMBER, BUILD_COMMIT, BUILD_COMPILER and BUILD_TARGET
# (0 and "unknown" outside a git checkout); configure_file writes only when the text changed.
include(${CMAKE_CURRENT_SOURCE_DIR}/cmake/build-info.cmake)
configure_file(${CMAKE_CURRENT_SOURCE_DIR}/common/build-info.cpp.in
               ${CMAKE_CURRENT_SOURCE_DIR}/common/build-info.cpp)
