# Locate the ONNX Runtime C/C++ headers. They ship in no Python wheel, so, in order:
#   1. ORT_INCLUDE_DIR (CMake variable or environment variable),
#   2. the system's libonnxruntime-dev (/usr/include/onnxruntime, /usr/local/include/onnxruntime),
#   3. scripts/fetch_ort_headers.sh, which downloads Debian trixie's libonnxruntime-dev into a cache.
# The headers are never copied into the repository.
if(NOT ORT_INCLUDE_DIR AND DEFINED ENV{ORT_INCLUDE_DIR})
  set(ORT_INCLUDE_DIR "$ENV{ORT_INCLUDE_DIR}")
endif()
if(ORT_INCLUDE_DIR)
  if(NOT EXISTS "${ORT_INCLUDE_DIR}/onnxruntime_cxx_api.h")
    message(FATAL_ERROR "ORT_INCLUDE_DIR=${ORT_INCLUDE_DIR} holds no onnxruntime_cxx_api.h")
  endif()
else()
  find_path(ORT_INCLUDE_DIR onnxruntime_cxx_api.h
            PATHS /usr/include/onnxruntime /usr/local/include/onnxruntime NO_DEFAULT_PATH)
endif()
if(NOT ORT_INCLUDE_DIR)
  unset(ORT_INCLUDE_DIR CACHE)
  message(STATUS "ort_mtp: ONNX Runtime headers not found on the system; fetching Debian's libonnxruntime-dev")
  execute_process(COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/scripts/fetch_ort_headers.sh"
                  OUTPUT_VARIABLE fetched OUTPUT_STRIP_TRAILING_WHITESPACE
                  ERROR_VARIABLE fetch_log RESULT_VARIABLE fetch_rc)
  if(NOT fetch_rc EQUAL 0 OR NOT EXISTS "${fetched}/onnxruntime_cxx_api.h")
    message(FATAL_ERROR
      "ONNX Runtime C/C++ headers not found and could not be fetched:\n${fetch_log}\n"
      "Provide them with one of:\n"
      "  sudo apt-get install libonnxruntime-dev   (Debian trixie / Ubuntu 24.04+)\n"
      "  export ORT_INCLUDE_DIR=/path/to/onnxruntime/include   (e.g. from an ONNX Runtime release archive)\n"
      "  bash scripts/fetch_ort_headers.sh   (needs apt-get and network access to deb.debian.org)")
  endif()
  set(ORT_INCLUDE_DIR "${fetched}" CACHE PATH "ONNX Runtime C/C++ include directory" FORCE)
endif()
message(STATUS "ort_mtp: ONNX Runtime headers from ${ORT_INCLUDE_DIR}")
