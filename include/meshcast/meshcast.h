// Umbrella header: everything a user of meshcast needs.
#pragma once

#include "meshcast/bootstrap.h"
#include "meshcast/box.h"
#include "meshcast/communicator.h"
#include "meshcast/dtype.h"
#include "meshcast/error.h"
#include "meshcast/layout.h"
#include "meshcast/local.h"
#include "meshcast/mesh.h"
#include "meshcast/plan.h"
#include "meshcast/region.h"
#include "meshcast/reshard.h"
#include "meshcast/spec.h"
#include "meshcast/task.h"
#include "meshcast/topology.h"
#include "meshcast/units.h"
#include "meshcast/verify.h"
