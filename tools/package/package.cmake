# package.cmake: the files that let other builds find an installed khub:
# pkg-config's khub.pc (applications), khub-server.pc (the hub server
# library, khub_server.h), khub-author.pc (the kernel author's library,
# khub_author.h) and khub-plugin.pc (kernel plugins: headers only,
# no library), and CMake's khubConfig.cmake with its version
# file and exported targets. Included from the top-level CMakeLists.txt.
#
# Both are relocatable: khub.pc derives its prefix from ${pcfiledir}, the
# CMake files from their own folder, so a tree installed with
# `cmake --install build --prefix P` still works when P is moved.
include(CMakePackageConfigHelpers)

# The plugin ABI version, from the header that defines it.
file(STRINGS ${PROJECT_SOURCE_DIR}/abi/khub/khub_version.h KHUB_ABI_LINES
    REGEX "^#define KHUB_ABI_(MAJOR|MINOR) ")
string(REGEX REPLACE ".*KHUB_ABI_MAJOR ([0-9]+).*" "\\1" KHUB_ABI_MAJOR "${KHUB_ABI_LINES}")
string(REGEX REPLACE ".*KHUB_ABI_MINOR ([0-9]+).*" "\\1" KHUB_ABI_MINOR "${KHUB_ABI_LINES}")
set(KHUB_CURL_DEP "")
if(KHUB_WITH_CURL)
    set(KHUB_CURL_DEP "CURL:libcurl")
endif()

set(KHUB_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/khub)
set(KHUB_PKGCONFIG_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# pkg-config: the prefix is found from the .pc file's own folder.
file(RELATIVE_PATH KHUB_PC_TO_PREFIX ${CMAKE_INSTALL_PREFIX}/${KHUB_PKGCONFIG_INSTALL_DIR}
    ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" KHUB_PC_TO_PREFIX "${KHUB_PC_TO_PREFIX}")
# What a static link (pkg-config --static) also needs: the private
# dependencies of libkhub.a, by their own .pc names (libmicrohttpd is
# libkhub_server's: khub-server.pc).
set(KHUB_PC_REQUIRES_PRIVATE "libcjson, libarchive, libelf, zlib, libcrypto")
if(KHUB_WITH_CURL)
    string(APPEND KHUB_PC_REQUIRES_PRIVATE ", libcurl")
endif()
foreach(pc khub khub-server khub-author khub-plugin)
    configure_file(${CMAKE_CURRENT_LIST_DIR}/${pc}.pc.in ${PROJECT_BINARY_DIR}/package/${pc}.pc
        @ONLY)
    install(FILES ${PROJECT_BINARY_DIR}/package/${pc}.pc DESTINATION ${KHUB_PKGCONFIG_INSTALL_DIR})
endforeach()

# CMake: find_package(khub [0.1] [COMPONENTS static]).
install(EXPORT khubTargets NAMESPACE khub:: DESTINATION ${KHUB_CMAKE_INSTALL_DIR}
    FILE khubTargets.cmake)
install(EXPORT khubStaticTargets NAMESPACE khub:: DESTINATION ${KHUB_CMAKE_INSTALL_DIR}
    FILE khubStaticTargets.cmake)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/khubConfig.cmake.in
    ${PROJECT_BINARY_DIR}/package/khubConfig.cmake INSTALL_DESTINATION ${KHUB_CMAKE_INSTALL_DIR}
    PATH_VARS KHUB_PLUGIN_INSTALL_REL CMAKE_INSTALL_INCLUDEDIR)
# Same major, at least the asked minor: the ABI rules of abi/ABI.md.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/khubConfigVersion.cmake
    VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/package/khubConfig.cmake
    ${PROJECT_BINARY_DIR}/package/khubConfigVersion.cmake DESTINATION ${KHUB_CMAKE_INSTALL_DIR})
