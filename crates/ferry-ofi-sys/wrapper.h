/* Everything ferry's ofi driver calls; bindgen reads this, and the generated static-inline
 * wrappers include it. */
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_eq.h>
