/* A plugin written in C++ from include/memplug.h alone, the way a vendor
 * would: no extern "C" of its own. The header's entry prototype gives the
 * definition C linkage, so the exported name is unmangled. It refuses every
 * host (it only has to be found). */
#include "memplug.h"

#include <cstring>

MEMPLUG_EXPORT MemplugStatus memplug_plugin_v1(const MemplugHostInfo *host, MemplugNegotiation *out,
                                               const MemplugMessageSink *sink) {
    (void)host;
    (void)out;
    static const char msg[] = "cpp_vendor_plugin: found, and refusing on purpose";
    if (sink != nullptr && sink->write != nullptr) {
        sink->write(sink->ctx, msg, std::strlen(msg));
    }
    return MEMPLUG_STATUS_VERSION_MISMATCH;
}
